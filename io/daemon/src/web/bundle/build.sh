#!/usr/bin/env bash
# Rebuilds ../assets/vendor/pi-client.module.js, the published pi-client and
# chord (pinned here and in package-lock.json) as one browser ES module, and
# the licences of everything it holds. Run it after changing a version, and
# commit the bundle with the lock.
set -euo pipefail
cd "$(dirname "$0")"
npm ci --no-audit --no-fund --ignore-scripts=false >/dev/null
out=../assets/vendor
npx --no-install esbuild entry.js --bundle --format=esm --platform=browser --target=es2022 \
  --minify --legal-comments=none --metafile=meta.json --outfile="$out/pi-client.module.js" --log-level=warning
# The licence of each package the bundle holds.
node -e '
const fs = require("fs"), path = require("path");
const inputs = Object.keys(require("./meta.json").inputs);
const pkgs = [...new Set(inputs.map((f) => f.match(/^node_modules\/((?:@[^/]+\/)?[^/]+)/)?.[1]).filter(Boolean))].sort();
let text = "Licences of the packages bundled in pi-client.module.js (see ../bundle/).\n";
for (const p of pkgs) {
  const dir = path.join("node_modules", p);
  const { version, license } = require("./" + dir + "/package.json");
  const file = fs.readdirSync(dir).find((f) => /^licen[cs]e/i.test(f));
  text += `\n==== ${p} ${version} (${license}) ====\n\n` + (file ? fs.readFileSync(path.join(dir, file), "utf8") : `${license}\n`);
}
fs.writeFileSync(process.argv[1], text);
' "$out/LICENSE-pi-client"
rm -f meta.json
echo "built $out/pi-client.module.js ($(wc -c <"$out/pi-client.module.js") bytes)"
