// The durable-server seed scenarios, driven with the PUBLISHED v8 client.
//
//   node seed.mjs <path-to-pi-server-binary> [filter]
//   node seed.mjs --connect <socketPath> [--server-id <uuid>] [--model P/M] [filter]
//
// The seed is pi-mono's `packages/coding-agent/test/experimental-remote-runtime.test.ts`
// (commit 48dd1e2f0f; /work/shared/reference/seeds/002_*.txt), 26 tests of pi's
// TypeScript durable server. Its scenarios are ported here as our own tests, on
// @earendil-works/pi-client@0.85.1 + @earendil-works/chord@0.85.1 from npm
// (`./install.sh`), against our `pi-server` binary over protocol v8.
//
// With a binary, every test gets its own temporary root (/tmp/pv8-…) holding
// home/, agent/ (PI_CODING_AGENT_DIR, with settings.json naming the default
// model), server/ (PI_SERVER_DIR), sessions/ and one log per server started;
// it starts `pi-server serve --server-dir D --server-id ID --session-dir S`
// itself (ID a random lowercase UUIDv4, or the seed's fixed ids where the
// scenario names them; PI_SERVER_DIR/PI_SERVER_ID/HOME/PI_CODING_AGENT_DIR set,
// every other PI_* variable and the API keys removed, PI_FAUX_DELAY_MS=5),
// waits for <serverDir>/<serverId>.sock to answer a v8 hello, creates the
// seed's sessions demo-1 and demo-2 through pi.session-management.create (pi's
// test writes them with its own on-disk helper; our layout differs, so the
// protocol makes them), runs the scenario, then disposes its clients, stops
// its servers (SIGTERM, then SIGKILL) and SIGKILLs every process whose
// command line or environment mentions the root (workers, auto-started
// servers), also on failure, and removes the root (kept with
// PI_V8_SEED_KEEP=1 when the test failed).
//
// --connect runs only the scenarios that need no process control against a
// server that is already running (the reference mock,
// /work/shared/reference/v8-probe/mock-server.mjs, or our server started by
// hand); the others print `skip`. --server-id defaults to the socket's file
// name. The sessions demo-1 and demo-2 are created there when missing.
// --model P/M is the model new Sessions get (default faux/faux-reasoner, our
// embedded offline reasoning model: written to settings.json with a binary;
// the mock's is anthropic/claude-sonnet-4-5). The filter is a list of seed
// numbers (`10,15`) or a case-insensitive substring of the test names.
// Checked against the mock (a writable copy of v8-probe, `npm install`, then
// `node mock-server.mjs <dir>` and `node seed.mjs --connect
// <dir>/00000000-0000-4000-8000-000000000001.sock --model
// anthropic/claude-sonnet-4-5`): 5, 10, 11, 14, 15, 17, 18 and 26 pass.
//
// Output: `ok <name>`, `FAIL <name>: <error>` (then `#` lines: details and the
// tail of the server logs) or `skip <name>: <why>` per test, `#` notes, and last
// `v8 seed: N passed, M failed`; the exit status is 1 when a test failed.
// PI_V8_SEED_WAIT_MS sets how long any one wait may take (default 30000).
//
// Worker processes (seed: `runtime.workerPids`, which a separate binary does
// not have): every live, non-zombie process (from /proc/<pid>/stat) whose
// /proc/<pid>/cmdline has `worker` as its first argument (`pi-server worker`)
// and whose command line or environment (/proc/<pid>/environ) contains the
// test root; its session is $PI_WORKER_SESSION_ID from its environment (how
// our server spawns workers: io/daemon/src/server/platform.rs). "The server's worker
// of S is gone" is read as "no such live process for S".
//
// The seed's 26 tests, and what became of each here (test names: `seed-NN …`):
//
//  1 uses PI_SERVER_DIR and PI_SERVER_ID: ADAPTED. `serve` gets only the two
//    variables (no --server-dir/--server-id/--session-dir). Asserted: the
//    socket is $PI_SERVER_DIR/$PI_SERVER_ID.sock, a 0600 socket; the dir is
//    0700, holds no dotfiles, every socket in it is 0600 and every entry names
//    the server id (siblings may share the dir); the sessions land in the
//    default $PI_CODING_AGENT_DIR/sessions. pi's dir holds EXACTLY 3 entries
//    (<id>.sock, control-<id>.sock, server-<id>-<12 hex>.sock); ours differs
//    (e.g. <id>.workers.sock, no control socket), so the count is not
//    asserted, the entries are printed as a note. pi's `runClient list` is the
//    harness's runClient (discoverUnixServers + pi.session-directory).
//  2 rejects a provider without a model: ADAPTED to our CLI, as `serve` takes
//    no model option: `pi-server --model anthropic list` (a provider without a
//    model) fails with the PROVIDER/MODEL usage error and starts no server.
//  3 preserves an existing Session model when the server default changes:
//    ADAPTED. pi reads the model from the session's pi-durable sqlite
//    (readExperimentalSessionState, TS-only); here it is read over the wire
//    from pi.models. settings.json default faux/faux-1 → attach demo-1 →
//    worker retires → server stops → default becomes faux/faux-reasoner → a
//    new server (same dirs) → demo-1 still has faux/faux-1 (and, to show the
//    default did change, a Session created now has faux/faux-reasoner).
//  4 rejects model options when discovery selects an existing server:
//    ADAPTED to our CLI (pi's check is in its TS client runClient): with a
//    server running (found by discoverUnixServers), `pi-server --model
//    faux/faux-1 list` fails with "Model selection is only valid when
//    automatically activating a new server".
//  5 rechecks an auto-discovered server after a version mismatch: PORTED, with
//    the harness's openRuntime standing in for pi's openClientRuntime (not
//    published): Client.connect is stubbed to fail once with
//    ServerError{code:"version"}; the runtime rediscovers and connects, and
//    lists exactly our server. Added server side: a raw hello of version 7
//    gets hello_error{code:"version"} and the server keeps serving.
//  6 serializes concurrent cold activation and retires after both clients
//    leave: ADAPTED. pi's TS client spawns pi's TS server; here two concurrent
//    `pi-server list -q` (our CLI, v1) with PI_SERVER_DIR/PI_SERVER_ID and no
//    server running both list demo-1 and demo-2, exactly one `serve` runs,
//    and it retires (its sockets go, the process exits). The sessions are
//    made first by a server that is then stopped.
//  7 passes client plugin packages to a cold server and restores them for its
//    next generation: LEFT OUT. Needs pi's TS activation and Node plugin
//    packages built into presentation facet bundles (chord's bundler); our
//    server answers prepareSession with {presentationFacetBundles: []}.
//  8 retires a cold server after its only Session attachment disconnects:
//    ADAPTED. Our CLI cold-starts the server (`list`, PI_SERVER_IDLE_EXIT_MS
//    =1500), then a v8 client attaches demo-1 (a worker runs) and holds the
//    server past its idle exit; after the client disconnects the server
//    retires (sockets gone, no worker, no serve process).
//  9 runs and discovers multiple logical servers from one directory: PORTED
//    (two `serve` sharing one server dir and one session dir; pi's control
//    sockets are checked as the public ones, ours have no control socket; the
//    second server learns demo-1/demo-2 from the shared session dir).
// 10 hydrates and mutates server Session services across framed clients:
//    PORTED (wire only; --connect removes a leftover demo-3 first).
// 11 hydrates and updates the Models service across concurrent framed
//    clients: PORTED. The model is --model (faux/faux-reasoner: several
//    thinking levels, so cycleThinking changes it), not anthropic/
//    claude-sonnet-4-5 (no key offline). Worker pids only with a binary.
// 12 loads conventional Session facets from multiple configured plugin
//    packages: LEFT OUT. Session plugins are Node facet packages loaded into
//    pi's Node worker (pi.example-plugin.greeting, test.second-plugin); a
//    server without a Node plugin host cannot serve them.
// 13 uses the most recently selected model for a new Session: ADAPTED. After
//    demo-1 selects faux/faux-1 (default faux/faux-reasoner) and its worker
//    retires, a Session CREATED after the selection (demo-3) has faux/faux-1.
//    pi checks demo-2, which existed before but was never opened, because pi
//    picks a Session's model at its first open; a server that picks it at
//    create would fail that for a reason the seed does not mean to test.
//    What demo-2 got is printed as a note.
// 14 composes management attachment with Session service hydration: ADAPTED.
//    openClientRuntime/activateBuiltinClientServices are not published; the
//    harness composes the same from published APIs (openRuntime with an
//    explicit socket + activateBuiltins: server services Directory,
//    Management, PresentationPlugins; Session services Models,
//    AgentController, Transcript; attach waits for whenAttached). Also
//    asserted: prepareSession(null) returns a presentationFacetBundles array.
// 15 fences superseded attachment hydration by attachment generation: PORTED
//    (vi.spyOn becomes an instance override of client.subscribeService,
//    which createClientServiceTransport calls).
// 16 observes keyed service instances and fences replacement generations:
//    LEFT OUT. It needs test.keyed-probe, a keyed service of pi's faux test
//    worker only (spawnInternalProcess spied); no production v8 server has it.
// 17 answers a client prompt through the worker-owned service provider:
//    ADAPTED. pi swaps in a faux worker answering "deterministic remote
//    answer"; ours runs its embedded faux model, so: runClient({sessionId:
//    demo-1, prompt}) returns kind "prompted" with a non-empty text
//    (waitForPrompt), and the transcript gains a pi.assistant entry.
// 18 replicates the transcript after consecutive prompts: PORTED (text
//    non-empty instead of "deterministic remote answer"; pi.assistant counts
//    are relative to the transcript's count before the first prompt, so
//    that a --connect server may have history).
// 19 stops an idle Session worker after its client disconnects: PORTED (pids
//    from /proc).
// 20 starts one process per attached session and stops them during shutdown:
//    PORTED (runtime.close() = SIGTERM; waits for the server to exit).
// 21 server runtime replaces an exited worker on the next attach: PORTED
//    (SIGKILL from here; also waits for the client's attachment to drop to
//    null, as a worker exit publishes, before attaching again).
// 22 discovers workers after replacing the server: PORTED (a second `serve`
//    with the same id and dirs replaces the first; the worker survives and
//    is reused on attach; demo-2 gets a new worker).
// 23 retires an unclaimed idle worker after replacement demand expires:
//    ADAPTED. pi's __PI_SESSION_WORKER_ORPHAN_DEMAND_GRACE_MS=50 is ours
//    PI_SERVER_ADOPTION_GRACE_MS (both set), at 1000 ms rather than 50 so
//    that "the replacement holds the worker" can be checked before it
//    retires (up to the wait limit, not 5 s).
// 24 restores tracked sessions that are outside the replacement catalog:
//    PORTED (the replacement gets an empty --session-dir). The listing is
//    retried until it shows demo-1: pi's startServer returns after worker
//    discovery, ours answers hellos before the released worker re-announces.
// 25 reports missing and ambiguous session selections: PORTED with the
//    harness's runClient (pi's errors are client-side: "No discovered server
//    contains session missing", "Session demo-1 is available from more than
//    one server"); also checks our CLI's own wording for the same two cases
//    ("No session matches missing", "… available from more than one server").
// 26 rejects a duplicate session ID within one session directory: ADAPTED.
//    pi calls its on-disk helper (no server); here
//    pi.session-management.create({id: "demo-1"}) with demo-1 existing
//    rejects with a ServerError (pi: internal_error) and changes nothing.
//
// mixed-v1-v8 (one server, one session, a v1 client and a v8 client): NOT
// here, since this package pins only the v8 client. It would take the v1 client
// of tests/interop (@earendil-works/pi-client@0.84.4) in the same Node process,
// e.g. an npm alias in this package.json ("pi-client-v1":
// "npm:@earendil-works/pi-client@0.84.4", whose own pi-protocol 0.84.4 npm
// nests under it) or a second script run from tests/interop against the same
// socket. The scenario: v1 PiClient creates a session and prompts it; a v8
// Client attaches it via pi.session-management and sees pi.user/pi.assistant
// entries in pi.transcript; a v8 prompt then shows in the v1 client's next
// snapshot, and both see one model (v1 set_model → v8 pi.models
// configuration); remove from v8 detaches the v1 client.
import { spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import { closeSync, existsSync, mkdirSync, mkdtempSync, openSync, readdirSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { lstat, readdir } from "node:fs/promises";
import { createConnection } from "node:net";
import { basename, dirname, join, resolve } from "node:path";
import assert from "node:assert/strict";
import { defineService } from "@earendil-works/chord";
import { BACKGROUND_CONTEXT } from "@earendil-works/chord/context";
import { Client, ServerError } from "@earendil-works/pi-client";
import { createUnixTransportFactory, discoverUnixServers } from "@earendil-works/pi-client/unix";
import { decodeCbor, encodeCbor, encodeFrame, FrameDecoder } from "@earendil-works/pi-protocol";
import { serverBinding, ServerServiceSource, sessionBinding, SessionServiceSource } from "./sources.mjs";

const BG = BACKGROUND_CONTEXT;
const WAIT = Number(process.env.PI_V8_SEED_WAIT_MS ?? 30_000);
const TEST_TIMEOUT = Math.max(180_000, WAIT * 4);
const SEED_ID_1 = "00000000-0000-4000-8000-000000000001";
const SEED_ID_2 = "00000000-0000-4000-8000-000000000002";
const UUID_V4 = /^[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}$/;

// Service contracts: chord matches services by id, so a descriptor is its id.
const SessionDirectory = defineService("pi.session-directory");
const SessionManagement = defineService("pi.session-management");
const PresentationPlugins = defineService("pi.presentation-plugins");
const SessionPlugins = defineService("pi.session-plugins");
const AgentController = defineService("pi.agent-controller");
const Models = defineService("pi.models");
const Transcript = defineService("pi.transcript");

// ---------------------------------------------------------------------------
// Command line

function usage(message) {
	if (message) console.error(`seed.mjs: ${message}`);
	console.error(
		"usage: node seed.mjs <pi-server-binary> [filter]\n" +
			"       node seed.mjs --connect <socketPath> [--server-id <uuid>] [--model provider/modelId] [filter]",
	);
	process.exit(2);
}

function parseModel(text) {
	const slash = text.indexOf("/");
	if (slash <= 0 || slash === text.length - 1) usage(`--model ${text}: expected provider/modelId`);
	return { provider: text.slice(0, slash), modelId: text.slice(slash + 1) };
}

const options = { binary: undefined, connect: undefined, serverId: undefined, model: undefined, filter: undefined };
{
	const positional = [];
	const argv = process.argv.slice(2);
	for (let i = 0; i < argv.length; i++) {
		const arg = argv[i];
		const value = () => argv[++i] ?? usage(`${arg} needs a value`);
		if (arg === "--connect") options.connect = resolve(value());
		else if (arg === "--server-id") options.serverId = value();
		else if (arg === "--model") options.model = parseModel(value());
		else if (arg === "-h" || arg === "--help") usage();
		else if (arg.startsWith("--")) usage(`unknown option ${arg}`);
		else positional.push(arg);
	}
	if (options.connect) {
		options.serverId ??= basename(options.connect).replace(/\.sock$/, "");
		if (!UUID_V4.test(options.serverId)) usage(`server id ${options.serverId} is not a lowercase UUIDv4`);
		if (positional.length > 1) usage("too many arguments");
		options.filter = positional[0];
	} else {
		if (positional.length === 0) usage("the pi-server binary is required");
		if (positional.length > 2) usage("too many arguments");
		options.binary = resolve(positional[0]);
		if (!existsSync(options.binary)) usage(`${options.binary} does not exist`);
		options.filter = positional[1];
	}
	options.model ??= { provider: "faux", modelId: "faux-reasoner" };
}
const connectMode = options.connect !== undefined;

// ---------------------------------------------------------------------------
// Small helpers

const sleep = (ms) => new Promise((r) => setTimeout(r, ms));

/** `promise`, or a rejection naming `what` after `ms`. */
async function within(what, promise, ms = WAIT) {
	let timer;
	try {
		return await Promise.race([
			promise,
			new Promise((_, reject) => {
				timer = setTimeout(() => reject(new Error(`timed out after ${ms} ms waiting for ${what}`)), ms);
			}),
		]);
	} finally {
		clearTimeout(timer);
	}
}

/** Retries `check` (sync or async; throws while unmet) every `interval` ms until it passes. */
async function waitFor(what, check, { timeout = WAIT, interval = 20 } = {}) {
	const deadline = Date.now() + timeout;
	for (;;) {
		try {
			return await check();
		} catch (error) {
			if (Date.now() >= deadline) {
				const reason = error instanceof Error ? error.message : String(error);
				throw new Error(`timed out after ${timeout} ms waiting for ${what}: ${reason}`);
			}
		}
		await sleep(interval);
	}
}

const show = (value) => JSON.stringify(value);

/** vitest's toMatchObject: every key of `pattern` matches, arrays element by element with equal length. */
function matchObject(actual, pattern, path = "value") {
	const fail = (why) => {
		throw new assert.AssertionError({ message: `${path}: ${why} (got ${show(actual)}, expected to match ${show(pattern)})` });
	};
	if (pattern === null || typeof pattern !== "object") {
		if (!Object.is(actual, pattern)) fail("differs");
		return;
	}
	if (Array.isArray(pattern)) {
		if (!Array.isArray(actual) || actual.length !== pattern.length) fail("not an array of that length");
		pattern.forEach((p, i) => matchObject(actual[i], p, `${path}[${i}]`));
		return;
	}
	if (actual === null || typeof actual !== "object") fail("not an object");
	for (const [key, value] of Object.entries(pattern)) matchObject(actual[key], value, `${path}.${key}`);
}

async function rejects(what, promise, check) {
	try {
		await promise;
	} catch (error) {
		check(error);
		return error;
	}
	throw new assert.AssertionError({ message: `${what} should have failed` });
}

const sessionIds = (directoryState) => directoryState?.sessions.map(({ sessionId }) => sessionId);
const assistantCount = (view) => view?.entries.filter((entry) => entry.kind === "pi.assistant").length ?? 0;
const errorText = (error) => (error instanceof ServerError ? `${error.code}: ${error.message}` : String(error?.message ?? error));

// ---------------------------------------------------------------------------
// Processes, through /proc

function procFile(pid, file) {
	try {
		return readFileSync(`/proc/${pid}/${file}`);
	} catch {
		return undefined;
	}
}

/** True while `pid` exists and is not a zombie. */
function alive(pid) {
	const stat = procFile(pid, "stat")?.toString();
	if (stat === undefined) return false;
	const state = stat.slice(stat.lastIndexOf(")") + 1).trim()[0];
	return state !== "Z" && state !== "X";
}

const argsOf = (pid) => (procFile(pid, "cmdline")?.toString() ?? "").split("\0").filter((a) => a.length > 0);

function envOf(pid) {
	const env = {};
	for (const entry of (procFile(pid, "environ")?.toString() ?? "").split("\0")) {
		const eq = entry.indexOf("=");
		if (eq > 0) env[entry.slice(0, eq)] = entry.slice(eq + 1);
	}
	return env;
}

/** Live processes (not this one) whose command line or environment contains `needle`. */
function processesMentioning(needle) {
	const bytes = Buffer.from(needle);
	return readdirSync("/proc")
		.filter((name) => /^\d+$/.test(name))
		.map(Number)
		.filter((pid) => pid !== process.pid && alive(pid))
		.filter((pid) => procFile(pid, "cmdline")?.includes(bytes) || procFile(pid, "environ")?.includes(bytes));
}

function killAllMentioning(needle) {
	const deadline = Date.now() + 10_000;
	for (;;) {
		const pids = processesMentioning(needle);
		if (pids.length === 0 || Date.now() > deadline) return pids;
		for (const pid of pids) {
			try {
				process.kill(pid, "SIGKILL");
			} catch {}
		}
		Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 20);
	}
}

// ---------------------------------------------------------------------------
// The test context: a temporary root, servers, clients, cleanup

const liveContexts = new Set();

class TestContext {
	notes = [];
	servers = [];
	clients = new Set();
	cleanups = [];
	model = options.model;
	#serverCount = 0;

	constructor(name) {
		this.name = name;
		// Short: Unix socket paths are limited to 108 bytes.
		this.root = mkdtempSync("/tmp/pv8-");
		this.home = join(this.root, "home");
		this.agentDir = join(this.root, "agent");
		this.workDir = join(this.root, "work");
		for (const dir of [this.home, this.agentDir, this.workDir]) mkdirSync(dir, { recursive: true });
		this.writeSettings({ defaultProvider: this.model.provider, defaultModel: this.model.modelId });
		liveContexts.add(this);
	}

	note(text) {
		this.notes.push(text);
		console.log(`# ${this.name}: ${text}`);
	}

	/** Replaces <agentDir>/settings.json (the default model of new Sessions). */
	writeSettings(settings) {
		writeFileSync(join(this.agentDir, "settings.json"), `${JSON.stringify(settings)}\n`);
	}

	/** The environment of a server or CLI process: isolated in the root. */
	env(extra = {}) {
		const env = { ...process.env };
		for (const key of Object.keys(env)) {
			if (/^_*PI_/.test(key) || /_API_KEY$/.test(key) || /_BASE_URL$/.test(key) || key === "GLIBC_TUNABLES") {
				delete env[key];
			}
		}
		return { ...env, HOME: this.home, PI_CODING_AGENT_DIR: this.agentDir, PI_FAUX_DELAY_MS: "5", RUST_LOG: "info", ...extra };
	}

	/**
	 * Starts `pi-server serve` and waits until its socket answers a v8 hello.
	 * `envOnly`: the dirs and id only through PI_SERVER_DIR/PI_SERVER_ID (and
	 * the default session dir). `replaces`: a running server of the same id,
	 * waited for to exit before the new one is probed.
	 */
	async startServer({ serverId = randomUUID(), serverDir, sessionDir, envOnly = false, env = {}, replaces } = {}) {
		if (connectMode) throw new Error("this test needs process control (not available with --connect)");
		assert.match(serverId, UUID_V4);
		serverDir ??= join(this.root, "server");
		sessionDir ??= envOnly ? join(this.agentDir, "sessions") : join(this.root, "sessions");
		const n = ++this.#serverCount;
		const logPath = join(this.root, `server-${n}.log`);
		const args = ["serve"];
		if (!envOnly) args.push("--server-dir", serverDir, "--server-id", serverId, "--session-dir", sessionDir);
		const fd = openSync(logPath, "a");
		const child = spawn(options.binary, args, {
			cwd: this.workDir,
			env: this.env({ PI_SERVER_DIR: serverDir, PI_SERVER_ID: serverId, ...env }),
			stdio: ["ignore", fd, fd],
		});
		closeSync(fd);
		const server = {
			n,
			serverId,
			serverDir,
			sessionDir,
			directory: serverDir,
			socketPath: join(serverDir, `${serverId}.sock`),
			logPath,
			child,
			pid: child.pid,
			status: undefined,
		};
		server.exited = new Promise((resolveExit) => {
			child.once("exit", (code, signal) => {
				server.status = { code, signal };
				resolveExit(server.status);
			});
			child.once("error", (error) => {
				server.status = { code: null, signal: null, error: error.message };
				resolveExit(server.status);
			});
		});
		server.close = () => this.#stop(server);
		this.servers.push(server);
		if (replaces) {
			await within(
				`server ${replaces.n} to hand over to server ${n} and exit`,
				Promise.race([
					replaces.exited,
					server.exited.then((s) => {
						throw new Error(`the replacing server exited first: ${show(s)}`);
					}),
				]),
			);
		}
		await this.#waitReady(server);
		return server;
	}

	async #waitReady(server) {
		const deadline = Date.now() + WAIT;
		for (;;) {
			if (server.status) throw new Error(`server ${server.n} exited during startup: ${show(server.status)}`);
			let isSocket = false;
			try {
				isSocket = (await lstat(server.socketPath)).isSocket();
			} catch {}
			if (isSocket) {
				try {
					const client = await Client.connect({
						serverId: server.serverId,
						transportFactory: createUnixTransportFactory({ path: server.socketPath }),
					});
					await client.dispose();
					return;
				} catch (error) {
					if (error instanceof ServerError) {
						throw new Error(`server ${server.n} refused a v8 hello: ${errorText(error)}`);
					}
				}
			}
			if (Date.now() > deadline) throw new Error(`server ${server.n} did not answer at ${server.socketPath} within ${WAIT} ms`);
			await sleep(20);
		}
	}

	/** SIGTERM (the seed's `close()`), then waits for the exit; SIGKILL if it takes too long. */
	async #stop(server) {
		if (server.status) return server.status;
		server.child.kill("SIGTERM");
		try {
			return await within(`server ${server.n} to exit after SIGTERM`, server.exited);
		} catch (error) {
			server.child.kill("SIGKILL");
			await server.exited;
			throw error;
		}
	}

	/** The server to test: with a binary a fresh one; with --connect the given one. Ensures demo-1, demo-2. */
	async makeServer(startOptions = {}) {
		const server = connectMode
			? { serverId: options.serverId, socketPath: options.connect, directory: dirname(options.connect) }
			: await this.startServer(startOptions);
		await this.ensureSessions(server);
		return server;
	}

	/** Creates the seed's sessions through pi.session-management where missing. */
	async ensureSessions(server, ids = ["demo-1", "demo-2"]) {
		const client = await this.connect(server);
		const services = serverBinding(client, { services: [SessionDirectory, SessionManagement] });
		try {
			const directory = services.use(SessionDirectory);
			const management = services.use(SessionManagement);
			await services.ready(BG);
			for (const sessionId of ids) {
				if (sessionIds(directory.state.value).includes(sessionId)) continue;
				const summary = await management.create({ id: sessionId }, BG);
				matchObject(summary, { serverId: server.serverId, sessionId });
			}
		} finally {
			await services.dispose(BG);
			await this.disposeClient(client);
		}
	}

	async connect(server) {
		const client = await Client.connect({
			serverId: server.serverId,
			transportFactory: createUnixTransportFactory({ path: server.socketPath }),
		});
		this.clients.add(client);
		return client;
	}

	async disposeClient(client) {
		this.clients.delete(client);
		await within("a client to dispose", client.dispose(), 10_000);
	}

	/** Connects and attaches `sessionId` (the seed's attachClient). */
	async attachClient(server, sessionId) {
		const client = await this.connect(server);
		await attachSession(client, sessionId);
		return client;
	}

	/** Runs our CLI (isolated like the servers); resolves {code, signal, stdout, stderr}. */
	cli(args, { env = {}, timeout = WAIT } = {}) {
		if (connectMode) throw new Error("this test needs the binary (not available with --connect)");
		return new Promise((resolveRun) => {
			const child = spawn(options.binary, args, { cwd: this.workDir, env: this.env(env), stdio: ["ignore", "pipe", "pipe"] });
			let stdout = "";
			let stderr = "";
			child.stdout.on("data", (d) => (stdout += d));
			child.stderr.on("data", (d) => (stderr += d));
			const timer = setTimeout(() => child.kill("SIGKILL"), timeout);
			child.once("error", (error) => resolveRun({ code: null, signal: null, stdout, stderr: `${stderr}${error}` }));
			child.once("close", (code, signal) => {
				clearTimeout(timer);
				resolveRun({ code, signal, stdout, stderr });
			});
		});
	}

	/** Live worker processes of this test: [{pid, sessionId}]. */
	workers(sessionId) {
		return processesMentioning(this.root)
			.filter((pid) => argsOf(pid)[1] === "worker")
			.map((pid) => ({ pid, sessionId: envOf(pid).PI_WORKER_SESSION_ID ?? null }))
			.filter((w) => sessionId === undefined || w.sessionId === sessionId);
	}

	/** Waits until exactly one live worker runs `sessionId` (other than `except`); returns its pid. */
	async workerOf(sessionId, { except } = {}) {
		return waitFor(`one worker process of ${sessionId}${except ? ` other than ${except}` : ""}`, () => {
			const pids = this.workers(sessionId).map((w) => w.pid).filter((pid) => pid !== except);
			assert.equal(pids.length, 1, `worker pids of ${sessionId}: ${show(pids)}`);
			this.seenWorkers ??= new Map();
			if (!this.seenWorkers.has(sessionId)) this.seenWorkers.set(sessionId, new Set());
			this.seenWorkers.get(sessionId).add(pids[0]);
			return pids[0];
		});
	}

	async noWorkerOf(sessionId) {
		await waitFor(`no worker process of ${sessionId}`, () => assert.deepEqual(this.workers(sessionId), []));
		// An exiting process loses its command line (so `workers` no longer
		// lists it) a moment before it is gone: wait for the ones seen.
		const seen = [...(this.seenWorkers?.get(sessionId) ?? [])];
		await waitFor(`the worker processes of ${sessionId} to exit`, () =>
			assert.deepEqual(seen.filter(alive), []),
		);
	}

	/** `serve` processes of this test. */
	serveProcesses() {
		return processesMentioning(this.root).filter((pid) => argsOf(pid)[1] === "serve");
	}

	logTail(lines = 25) {
		const out = [];
		const logs = [];
		const scan = (dir) => {
			try {
				for (const name of readdirSync(dir)) {
					if (name.endsWith(".log")) logs.push(join(dir, name));
				}
			} catch {}
		};
		scan(this.root);
		for (const name of (() => {
			try {
				return readdirSync(this.root);
			} catch {
				return [];
			}
		})()) {
			scan(join(this.root, name));
		}
		for (const log of logs) {
			let text = "";
			try {
				text = readFileSync(log, "utf8");
			} catch {}
			const tail = text.trimEnd().split("\n").slice(-lines);
			out.push(`--- ${log} (last ${tail.length} lines)`, ...tail);
		}
		return out;
	}

	async cleanup(failed) {
		for (const fn of this.cleanups.reverse()) {
			try {
				await fn();
			} catch {}
		}
		await Promise.allSettled([...this.clients].map((c) => within("a client to dispose", c.dispose(), 5_000)));
		this.clients.clear();
		await Promise.allSettled(this.servers.map((s) => s.close()));
		const survivors = connectMode ? [] : killAllMentioning(this.root);
		if (survivors.length > 0) console.log(`# ${this.name}: processes ${survivors.join(", ")} survive SIGKILL`);
		liveContexts.delete(this);
		if (failed && process.env.PI_V8_SEED_KEEP === "1") console.log(`# ${this.name}: kept ${this.root}`);
		else rmSync(this.root, { recursive: true, force: true });
	}
}

// Never leave processes behind, whatever ends this script.
process.on("exit", () => {
	if (connectMode) return;
	for (const t of liveContexts) killAllMentioning(t.root);
});
for (const signal of ["SIGINT", "SIGTERM"]) {
	process.on(signal, () => {
		console.log(`# interrupted by ${signal}`);
		process.exit(130);
	});
}
process.on("unhandledRejection", (error) => console.log(`# unhandled rejection: ${errorText(error)}`));

// ---------------------------------------------------------------------------
// The client side pi's tests get from pi's (unpublished) client runtime,
// rebuilt on the published APIs.

/** Attaches `sessionId` through a short-lived server binding (the seed's attachSession). */
async function attachSession(client, sessionId) {
	const services = serverBinding(client, { services: [SessionManagement] });
	try {
		await services.ready(BG);
		await services.use(SessionManagement).attach(sessionId, BG);
	} finally {
		await services.dispose(BG);
	}
}

/**
 * pi's openClientRuntime: the servers of `directory` (discoverUnixServers) or
 * the one `connect` route, each with a connected Client and its server and
 * Session service sources. A discovered server that answers the first hello
 * with a version mismatch is checked again (rediscovered) and reconnected once.
 */
async function openRuntime(t, { directory, connect } = {}) {
	const routes = connect ? [connect] : await discoverUnixServers({ directory });
	const servers = [];
	const dispose = async () => {
		const sources = servers.flatMap((s) => [s.server, s.session]);
		await Promise.allSettled(sources.map((source) => source.dispose(BG)));
		await Promise.allSettled(servers.map((s) => t.disposeClient(s.client)));
	};
	const open = (route) =>
		Client.connect({ serverId: route.serverId, transportFactory: createUnixTransportFactory({ path: route.path }) });
	try {
		for (const route of routes) {
			let client;
			try {
				client = await open(route);
			} catch (error) {
				if (connect || !(error instanceof ServerError) || error.code !== "version") throw error;
				const again = (await discoverUnixServers({ directory })).find((r) => r.serverId === route.serverId);
				if (!again) throw error;
				client = await open(again);
			}
			t.clients.add(client);
			servers.push({
				route,
				client,
				server: new ServerServiceSource(client),
				session: new SessionServiceSource(client),
			});
		}
	} catch (error) {
		await dispose();
		throw error;
	}
	return { servers, dispose };
}

/** pi's activateBuiltinClientServices: the built-in facades of one runtime server, hydrated. */
async function activateBuiltins(server) {
	const errors = [];
	const onError = (e) => errors.push(e);
	const serverServices = server.server.open({
		services: [SessionDirectory, SessionManagement, PresentationPlugins],
		assertAccess() {},
		onError,
	});
	const sessionServices = server.session.open({ services: [Models, AgentController, Transcript], assertAccess() {}, onError });
	const remote = serverServices.use(SessionManagement);
	const management = {
		create: (options, context) => remote.create(options, context),
		async remove(sessionId, context) {
			const current = server.client.attachment?.sessionId === sessionId;
			await remote.remove(sessionId, context);
			if (current) await server.session.whenDetached(context);
		},
		async attach(sessionId, context) {
			await remote.attach(sessionId, context);
			await server.session.whenAttached(sessionId, context);
		},
		async detach(context) {
			await remote.detach(context);
			await server.session.whenDetached(context);
		},
	};
	const activated = {
		...server,
		errors,
		directory: serverServices.use(SessionDirectory),
		management,
		plugins: serverServices.use(PresentationPlugins),
		models: sessionServices.use(Models),
		agent: sessionServices.use(AgentController),
		transcript: sessionServices.use(Transcript),
	};
	await Promise.all([serverServices.ready(BG), sessionServices.ready(BG)]);
	return activated;
}

/**
 * pi's runClient: with neither sessionId nor prompt, lists the Sessions of
 * every discovered server; with a sessionId, attaches the one server holding
 * it; with a prompt, also prompts it and waits for the answer (waitForPrompt)
 * and for the transcript's new pi.assistant entry.
 */
async function runClient(t, command, { directory, connect } = {}) {
	const runtime = await openRuntime(t, { directory, connect });
	try {
		const found = await Promise.all(runtime.servers.map(activateBuiltins));
		if (command.sessionId === undefined && command.prompt === undefined) {
			return {
				kind: "list",
				sessions: found
					.flatMap(({ route, directory }) =>
						directory.state.value.sessions.map(({ sessionId }) => ({ serverId: route.serverId, sessionId })),
					)
					.sort((a, b) => a.serverId.localeCompare(b.serverId) || a.sessionId.localeCompare(b.sessionId)),
			};
		}
		let sessionId = command.sessionId;
		let match;
		if (sessionId === undefined) {
			if (found.length !== 1) throw new Error("Client prompt requires exactly one discovered server to create a Session");
			match = found[0];
			sessionId = (await match.management.create({}, BG)).sessionId;
		} else {
			const matches = found.filter((f) => sessionIds(f.directory.state.value).includes(sessionId));
			if (matches.length > 1) throw new Error(`Session ${sessionId} is available from more than one server`);
			if (matches.length === 1) match = matches[0];
			else {
				if (command.prompt === undefined || found.length !== 1) {
					throw new Error(`No discovered server contains session ${sessionId}`);
				}
				match = found[0];
				await match.management.create({ id: sessionId }, BG);
			}
		}
		await match.plugins.prepareSession({ sessionId, packagePaths: null }, BG);
		await match.management.attach(sessionId, BG);
		if (command.prompt === undefined) return { kind: "attached", serverId: match.route.serverId, sessionId };

		const before = assistantCount(match.transcript.state.value);
		const response = await match.agent.prompt({ message: command.prompt, images: null }, BG);
		if (!response.accepted) throw new Error(`prompt not accepted: ${show(response.error)}`);
		const answer = await match.agent.waitForPrompt(response.operationId, BG);
		if (answer.status !== "done") throw new Error(`prompt ${response.operationId} unanswered: ${answer.reason}`);
		let added = 0;
		try {
			await waitFor("a new pi.assistant transcript entry", () => {
				added = assistantCount(match.transcript.state.value) - before;
				assert.ok(added >= 1);
			});
		} catch {}
		if (match.errors.length > 0) throw match.errors[0];
		return { kind: "prompted", serverId: match.route.serverId, sessionId, text: answer.text, assistantEntriesAdded: added };
	} finally {
		await runtime.dispose();
	}
}

/** Sends a raw hello of `version`; resolves the decoded first reply. */
function rawHello(path, version) {
	return within(
		"a reply to a raw hello",
		new Promise((resolveReply, reject) => {
			const socket = createConnection(path);
			const frames = new FrameDecoder();
			socket.once("connect", () => socket.write(encodeFrame(encodeCbor({ type: "hello", version }))));
			socket.on("data", (chunk) => {
				const [frame] = frames.push(new Uint8Array(chunk.buffer, chunk.byteOffset, chunk.byteLength));
				if (frame) {
					resolveReply(decodeCbor(frame));
					socket.destroy();
				}
			});
			socket.once("error", reject);
			socket.once("close", () => reject(new Error("the server closed the connection without a reply")));
		}),
	);
}

const modelOf = (models) => models.state.value?.configuration.model;

/** A fresh client's view of `sessionId`'s pi.models configuration.model. */
async function sessionModel(t, server, sessionId) {
	const client = await t.attachClient(server, sessionId);
	const services = sessionBinding(client, { services: [Models] });
	try {
		const models = services.use(Models);
		await services.ready(BG);
		return modelOf(models);
	} finally {
		await services.dispose(BG);
		await t.disposeClient(client);
	}
}

async function createSession(t, server, sessionId) {
	const client = await t.connect(server);
	const services = serverBinding(client, { services: [SessionManagement] });
	try {
		await services.ready(BG);
		return await services.use(SessionManagement).create({ id: sessionId }, BG);
	} finally {
		await services.dispose(BG);
		await t.disposeClient(client);
	}
}

async function pathExists(path) {
	try {
		await lstat(path);
		return true;
	} catch (error) {
		if (error.code === "ENOENT") return false;
		throw error;
	}
}

// ---------------------------------------------------------------------------
// The tests

const tests = [];
/** `needsProcess`: starts, stops or inspects server or worker processes (skipped with --connect). */
function test(seed, title, { needsProcess = false } = {}, run) {
	tests.push({ seed, name: `seed-${String(seed).padStart(2, "0")} ${title}`, needsProcess, run });
}

test(1, "uses PI_SERVER_DIR and PI_SERVER_ID", { needsProcess: true }, async (t) => {
	const directory = join(t.root, "env-dir");
	const serverId = SEED_ID_1;
	const server = await t.startServer({ serverId, serverDir: directory, envOnly: true });
	assert.equal(server.socketPath, join(directory, `${serverId}.sock`));
	assert.equal((await lstat(directory)).mode & 0o777, 0o700, "the server dir is 0700");
	const socket = await lstat(server.socketPath);
	assert.ok(socket.isSocket(), "the public socket is a socket");
	assert.equal(socket.mode & 0o777, 0o600, "the public socket is 0600");
	const entries = (await readdir(directory)).sort();
	t.note(`server dir entries: ${entries.join(", ")} (pi: exactly <id>.sock, control-<id>.sock, server-<id>-<12 hex>.sock)`);
	assert.ok(entries.includes(`${serverId}.sock`));
	assert.deepEqual(entries.filter((e) => e.startsWith(".")), [], "no dotfiles");
	for (const entry of entries) {
		const stat = await lstat(join(directory, entry));
		if (stat.isSocket()) assert.equal(stat.mode & 0o777, 0o600, `${entry} is 0600`);
		assert.ok(entry.includes(serverId), `${entry} names the server id (servers may share the dir)`);
	}
	await t.ensureSessions(server);
	assert.ok(existsSync(join(t.agentDir, "sessions", "demo-1")), "sessions are kept in $PI_CODING_AGENT_DIR/sessions by default");
	matchObject(await runClient(t, {}, { directory }), {
		kind: "list",
		sessions: [
			{ serverId, sessionId: "demo-1" },
			{ serverId, sessionId: "demo-2" },
		],
	});
});

test(2, "rejects a provider without a model", { needsProcess: true }, async (t) => {
	const serverDir = join(t.root, "server");
	const run = await t.cli(["--server-dir", serverDir, "--session-dir", join(t.root, "sessions"), "--model", "anthropic", "list"]);
	assert.notEqual(run.code, 0, `exit status (stderr: ${run.stderr})`);
	assert.match(run.stderr, /PROVIDER\/MODEL/);
	const sockets = existsSync(serverDir) ? (await readdir(serverDir)).filter((e) => e.endsWith(".sock")) : [];
	assert.deepEqual(sockets, [], "no server was started");
});

test(3, "preserves an existing Session model when the server default changes", { needsProcess: true }, async (t) => {
	const first = { provider: "faux", modelId: "faux-1" };
	const later = { provider: "faux", modelId: "faux-reasoner" };
	t.writeSettings({ defaultProvider: first.provider, defaultModel: first.modelId });
	const firstServer = await t.makeServer();
	assert.deepEqual(await sessionModel(t, firstServer, "demo-1"), first);
	await t.noWorkerOf("demo-1");
	await firstServer.close();

	t.writeSettings({ defaultProvider: later.provider, defaultModel: later.modelId });
	const secondServer = await t.startServer();
	assert.deepEqual(await sessionModel(t, secondServer, "demo-1"), first, "demo-1 keeps its model");
	await t.noWorkerOf("demo-1");
	await createSession(t, secondServer, "demo-3");
	assert.deepEqual(await sessionModel(t, secondServer, "demo-3"), later, "the default did change");
});

test(4, "rejects model options when discovery selects an existing server", { needsProcess: true }, async (t) => {
	const server = await t.makeServer();
	const routes = await discoverUnixServers({ directory: server.directory });
	assert.deepEqual(
		routes.map((r) => r.serverId),
		[server.serverId],
	);
	const run = await t.cli(["--server-dir", server.serverDir, "--session-dir", server.sessionDir, "--model", "faux/faux-1", "list"]);
	assert.notEqual(run.code, 0, `exit status (stdout: ${run.stdout})`);
	assert.ok(
		run.stderr.includes("Model selection is only valid when automatically activating a new server"),
		`stderr: ${run.stderr}`,
	);
});

test(5, "rechecks an auto-discovered server after a version mismatch", {}, async (t) => {
	const server = await t.makeServer();
	const reply = await rawHello(server.socketPath, 7);
	matchObject(reply, { type: "hello_error", error: { code: "version" } });

	const connect = Client.connect;
	let calls = 0;
	Client.connect = async (connectOptions) => {
		calls += 1;
		if (calls === 1) throw new ServerError({ code: "version", message: "stale server" });
		return connect.call(Client, connectOptions);
	};
	let runtime;
	try {
		runtime = await openRuntime(t, { directory: server.directory });
	} finally {
		Client.connect = connect;
	}
	try {
		assert.deepEqual(
			runtime.servers.map(({ route }) => route.serverId),
			[server.serverId],
		);
		assert.equal(calls, 2, "one failed connect, one recheck");
		assert.ok(runtime.servers[0].client.connected);
	} finally {
		await runtime.dispose();
	}
});

/** pi's cold-activation tests start from a server dir with no server and sessions on disk. */
async function coldSessions(t, directory, serverId) {
	const server = await t.startServer({ serverId, serverDir: directory, envOnly: true });
	await t.ensureSessions(server);
	await server.close();
	assert.equal(await pathExists(server.socketPath), false, "the stopped server removed its socket");
	return server;
}

test(6, "serializes concurrent cold activation and retires after both clients leave", { needsProcess: true }, async (t) => {
	const directory = join(t.root, "auto");
	const serverId = SEED_ID_1;
	const socketPath = join(directory, `${serverId}.sock`);
	await coldSessions(t, directory, serverId);
	const env = { PI_SERVER_DIR: directory, PI_SERVER_ID: serverId, PI_SERVER_IDLE_EXIT_MS: "3000" };
	const runs = await Promise.all([t.cli(["list", "-q"], { env }), t.cli(["list", "-q"], { env })]);
	for (const run of runs) {
		assert.equal(run.code, 0, `list failed: ${run.stderr}`);
		assert.deepEqual(run.stdout.trim().split("\n").sort(), ["demo-1", "demo-2"]);
	}
	assert.equal(await pathExists(socketPath), true, "the activated server runs");
	// The loser of the activation race (if one was started) exits at once.
	await waitFor("exactly one activated server", () => assert.equal(t.serveProcesses().length, 1), { timeout: 2_000 });
	await waitFor("the activated server's socket to go", async () => assert.equal(await pathExists(socketPath), false));
	await waitFor("every socket of the server dir to go", async () =>
		assert.deepEqual((await readdir(directory)).filter((e) => e.endsWith(".sock")), []),
	);
	await waitFor("the activated server to exit", () => assert.deepEqual(t.serveProcesses(), []));
});

test(8, "retires a cold server after its only Session attachment disconnects", { needsProcess: true }, async (t) => {
	const directory = join(t.root, "auto");
	const serverId = SEED_ID_1;
	const target = { serverId, socketPath: join(directory, `${serverId}.sock`) };
	await coldSessions(t, directory, serverId);
	const env = { PI_SERVER_DIR: directory, PI_SERVER_ID: serverId, PI_SERVER_IDLE_EXIT_MS: "1500" };
	const run = await t.cli(["list", "-q"], { env });
	assert.equal(run.code, 0, `list failed: ${run.stderr}`);
	const client = await t.attachClient(target, "demo-1");
	assert.equal(client.attachment?.sessionId, "demo-1");
	const pid = await t.workerOf("demo-1");
	await sleep(2500);
	assert.equal(await pathExists(target.socketPath), true, "the attachment keeps the server past its idle exit");
	assert.ok(alive(pid), "the worker runs");
	await t.disposeClient(client);
	await waitFor("the cold server's socket to go", async () => assert.equal(await pathExists(target.socketPath), false));
	await t.noWorkerOf("demo-1");
	await waitFor("the cold server to exit", () => assert.deepEqual(t.serveProcesses(), []));
});

test(9, "runs and discovers multiple logical servers from one directory", { needsProcess: true }, async (t) => {
	const directory = join(t.root, "multi");
	const [first, second] = await Promise.all([
		t.startServer({ serverId: SEED_ID_1, serverDir: directory }),
		t.startServer({ serverId: SEED_ID_2, serverDir: directory }),
	]);
	assert.ok((await lstat(first.socketPath)).isSocket());
	assert.ok((await lstat(second.socketPath)).isSocket());
	await t.ensureSessions(first);
	const both = [SEED_ID_1, SEED_ID_2].flatMap((serverId) => [
		{ serverId, sessionId: "demo-1" },
		{ serverId, sessionId: "demo-2" },
	]);
	await waitFor(
		"both servers to list demo-1 and demo-2",
		async () => assert.deepEqual(await runClient(t, {}, { directory }), { kind: "list", sessions: both }),
		{ interval: 100 },
	);
	await first.close();
	await waitFor("the first server's socket to go", async () => assert.equal(await pathExists(first.socketPath), false));
	assert.deepEqual(await runClient(t, {}, { directory }), {
		kind: "list",
		sessions: [
			{ serverId: SEED_ID_2, sessionId: "demo-1" },
			{ serverId: SEED_ID_2, sessionId: "demo-2" },
		],
	});
});

test(10, "hydrates and mutates server Session services across framed clients", {}, async (t) => {
	const server = await t.makeServer();
	if (connectMode) {
		// A previous run against the same server left demo-3 behind.
		const client = await t.connect(server);
		const services = serverBinding(client, { services: [SessionDirectory, SessionManagement] });
		const directory = services.use(SessionDirectory);
		await services.ready(BG);
		if (sessionIds(directory.state.value).includes("demo-3")) await services.use(SessionManagement).remove("demo-3", BG);
		await services.dispose(BG);
		await t.disposeClient(client);
	}
	const firstClient = await t.connect(server);
	const secondClient = await t.connect(server);
	const errors = [];
	const onError = (e) => errors.push(e);
	const firstServices = serverBinding(firstClient, { services: [SessionDirectory, SessionManagement], onError });
	const secondServices = serverBinding(secondClient, { services: [SessionDirectory, SessionManagement], onError });
	matchObject(firstServices.connection.value, { status: "connected" });
	matchObject(secondServices.connection.value, { status: "connected" });
	assert.deepEqual(await firstServices.catalogue(BG), [
		{ serviceId: SessionDirectory.id, mode: "singleton" },
		{ serviceId: SessionManagement.id, mode: "singleton" },
		{ serviceId: PresentationPlugins.id, mode: "singleton" },
		// Ours, after pi's (pi's own server has none).
		...(connectMode
			? []
			: [
					{ serviceId: "pi-server.session-status", mode: "singleton" },
					{ serviceId: "pi-server.sessions", mode: "singleton" },
				]),
	]);
	const firstDirectory = firstServices.use(SessionDirectory);
	const secondDirectory = secondServices.use(SessionDirectory);
	const firstManagement = firstServices.use(SessionManagement);
	const secondManagement = secondServices.use(SessionManagement);
	await Promise.all([firstServices.ready(BG), secondServices.ready(BG)]);
	assert.deepEqual(sessionIds(firstDirectory.state.value), ["demo-1", "demo-2"]);
	assert.deepEqual(secondDirectory.state.value, firstDirectory.state.value);

	await firstManagement.create({ id: "demo-3" }, BG);
	await waitFor("both clients to see demo-3", () => {
		assert.ok(sessionIds(firstDirectory.state.value).includes("demo-3"));
		assert.deepEqual(secondDirectory.state.value, firstDirectory.state.value);
	});
	await Promise.all([firstManagement.attach("demo-1", BG), secondManagement.attach("demo-1", BG)]);
	assert.equal(firstClient.attachment?.sessionId, "demo-1");
	assert.equal(secondClient.attachment?.sessionId, "demo-1");

	await firstManagement.remove("demo-1", BG);
	await waitFor("demo-1 to be gone for both clients", () => {
		assert.equal(firstClient.attachment, undefined);
		assert.equal(secondClient.attachment, undefined);
		assert.ok(!sessionIds(firstDirectory.state.value).includes("demo-1"));
		assert.deepEqual(secondDirectory.state.value, firstDirectory.state.value);
	});
	await secondManagement.detach(BG);
	assert.deepEqual(errors.map(errorText), []);
	await Promise.all([firstServices.dispose(BG), secondServices.dispose(BG)]);
});

test(11, "hydrates and updates the Models service across concurrent framed clients", {}, async (t) => {
	const server = await t.makeServer();
	const firstClient = await t.attachClient(server, "demo-1");
	const workerPid = connectMode ? undefined : await t.workerOf("demo-1");
	const secondClient = await t.attachClient(server, "demo-1");
	if (!connectMode) assert.deepEqual(t.workers("demo-1").map((w) => w.pid), [workerPid], "one worker serves both");
	const errors = [];
	const onError = (e) => errors.push(e);
	const firstServices = sessionBinding(firstClient, { services: [Models], onError });
	const secondServices = sessionBinding(secondClient, { services: [Models], onError });
	const firstModels = firstServices.use(Models);
	const secondModels = secondServices.use(Models);
	await Promise.all([firstServices.ready(BG), secondServices.ready(BG)]);
	assert.deepEqual(firstServices.attachment.value, { status: "attached", sessionId: "demo-1" });
	assert.deepEqual(secondServices.attachment.value, { status: "attached", sessionId: "demo-1" });
	assert.deepEqual(modelOf(firstModels), t.model);
	assert.deepEqual(secondModels.state.value, firstModels.state.value);
	const previous = firstModels.state.value.configuration.thinkingLevel;
	await firstModels.cycleThinking(BG);
	await waitFor("the new thinking level on both clients", () => {
		assert.notEqual(firstModels.state.value.configuration.thinkingLevel, previous);
		assert.deepEqual(secondModels.state.value, firstModels.state.value);
	});
	assert.deepEqual(errors.map(errorText), []);
	await Promise.all([firstServices.dispose(BG), secondServices.dispose(BG)]);
});

test(13, "uses the most recently selected model for a new Session", { needsProcess: true }, async (t) => {
	const server = await t.makeServer();
	const selected =
		t.model.provider === "faux" && t.model.modelId === "faux-1"
			? { provider: "faux", modelId: "faux-reasoner" }
			: { provider: "faux", modelId: "faux-1" };
	const firstClient = await t.attachClient(server, "demo-1");
	const firstServices = sessionBinding(firstClient, { services: [Models] });
	const firstModels = firstServices.use(Models);
	await firstServices.ready(BG);
	await firstModels.select(selected, BG);
	await waitFor("demo-1 to show the selected model", () => assert.deepEqual(modelOf(firstModels), selected));
	await firstServices.dispose(BG);
	await t.disposeClient(firstClient);
	await t.noWorkerOf("demo-1");

	await createSession(t, server, "demo-3");
	assert.deepEqual(await sessionModel(t, server, "demo-3"), selected, "a Session created after the selection");
	t.note(`demo-2 (created before the selection, first opened after it) has ${show(await sessionModel(t, server, "demo-2"))}; pi gives it the selected model`);
});

test(14, "composes management attachment with Session service hydration", {}, async (t) => {
	const server = await t.makeServer();
	const runtime = await openRuntime(t, { connect: { serverId: server.serverId, path: server.socketPath } });
	try {
		const activated = await activateBuiltins(runtime.servers[0]);
		const prepared = await activated.plugins.prepareSession({ sessionId: "demo-1", packagePaths: null }, BG);
		assert.ok(Array.isArray(prepared?.presentationFacetBundles), `prepareSession returned ${show(prepared)}`);
		await activated.management.attach("demo-1", BG);
		assert.deepEqual(activated.session.attachment.value, { status: "attached", sessionId: "demo-1" });
		assert.deepEqual(modelOf(activated.models), t.model);
		assert.deepEqual(activated.errors.map(errorText), []);
	} finally {
		await runtime.dispose();
	}
});

test(15, "fences superseded attachment hydration by attachment generation", {}, async (t) => {
	const server = await t.makeServer();
	const client = await t.connect(server);
	const errors = [];
	const services = sessionBinding(client, { services: [Models], onError: (e) => errors.push(e) });
	const models = services.use(Models);
	await services.ready(BG);
	const states = [];
	const stopRecording = services.attachment.subscribe((state) => states.push(state));
	let releaseDelay;
	const delayed = new Promise((r) => (releaseDelay = r));
	const subscribeService = client.subscribeService.bind(client);
	client.subscribeService = async (target, serviceId, mode, listener, signal) => {
		if (target.sessionId === "demo-2" && serviceId === Models.id) await delayed;
		return subscribeService(target, serviceId, mode, listener, signal);
	};
	t.cleanups.push(() => delete client.subscribeService);
	try {
		await attachSession(client, "demo-2");
		assert.deepEqual(services.attachment.value, { status: "attaching", sessionId: "demo-2" });
		await attachSession(client, "demo-1");
		await services.whenAttached("demo-1", BG);
		assert.deepEqual(services.attachment.value, { status: "attached", sessionId: "demo-1" });
		assert.deepEqual(modelOf(models), t.model);
	} finally {
		releaseDelay();
		stopRecording();
		await services.dispose(BG);
	}
	const latestAttach = states.map((s) => s.status === "attaching" && s.sessionId === "demo-1").lastIndexOf(true);
	assert.ok(latestAttach >= 0, `states: ${show(states)}`);
	for (const state of states.slice(latestAttach)) {
		assert.ok(
			!(state.sessionId === "demo-2" && (state.status === "attached" || state.status === "degraded")),
			`a superseded state after the latest attach: ${show(states)}`,
		);
	}
	assert.deepEqual(errors.map(errorText), []);
});

test(17, "answers a client prompt through the worker-owned service provider", {}, async (t) => {
	const server = await t.makeServer();
	const result = await runClient(t, { sessionId: "demo-1", prompt: "question" }, { directory: server.directory });
	matchObject(result, { kind: "prompted", serverId: server.serverId, sessionId: "demo-1" });
	assert.equal(typeof result.text, "string");
	assert.ok(result.text.length > 0, "a non-empty answer");
	assert.ok(result.assistantEntriesAdded >= 1, "the transcript gained a pi.assistant entry");
});

test(18, "replicates the transcript after consecutive prompts", {}, async (t) => {
	const server = await t.makeServer();
	const client = await t.attachClient(server, "demo-1");
	const services = sessionBinding(client, { services: [AgentController, SessionPlugins, Transcript] });
	const controller = services.use(AgentController);
	const transcript = services.use(Transcript);
	await services.ready(BG);
	await services.use(SessionPlugins).reload(BG);
	try {
		const baseline = assistantCount(transcript.state.value);
		matchObject(transcript.state.value, { conversation: { id: 1 } });
		for (const [index, message] of ["first question", "second question"].entries()) {
			const response = await controller.prompt({ message, images: null }, BG);
			matchObject(response, { accepted: true, error: null });
			assert.equal(typeof response.operationId, "string");
			const answer = await controller.waitForPrompt(response.operationId, BG);
			assert.deepEqual(Object.keys(answer).sort(), ["reason", "status", "text"]);
			matchObject(answer, { status: "done", reason: null });
			assert.ok(typeof answer.text === "string" && answer.text.length > 0, `answer ${show(answer)}`);
			await waitFor(`${index + 1} new pi.assistant entries`, () =>
				assert.equal(assistantCount(transcript.state.value), baseline + index + 1),
			);
		}
	} finally {
		await services.dispose(BG);
	}
});

test(19, "stops an idle Session worker after its client disconnects", { needsProcess: true }, async (t) => {
	const server = await t.makeServer();
	const client = await t.attachClient(server, "demo-1");
	const pid = await t.workerOf("demo-1");
	await t.disposeClient(client);
	await t.noWorkerOf("demo-1");
	assert.equal(alive(pid), false);
});

test(20, "starts one process per attached session and stops them during shutdown", { needsProcess: true }, async (t) => {
	const server = await t.makeServer();
	await Promise.all([t.attachClient(server, "demo-1"), t.attachClient(server, "demo-2")]);
	const pids = [await t.workerOf("demo-1"), await t.workerOf("demo-2")];
	assert.equal(new Set(pids).size, 2);
	for (const pid of pids) assert.ok(alive(pid));
	await server.close();
	await waitFor("every worker to stop", () => assert.deepEqual(t.workers(), []));
	for (const pid of pids) assert.equal(alive(pid), false);
});

test(21, "server runtime replaces an exited worker on the next attach", { needsProcess: true }, async (t) => {
	const server = await t.makeServer();
	const client = await t.attachClient(server, "demo-1");
	const firstPid = await t.workerOf("demo-1");
	process.kill(firstPid, "SIGKILL");
	await t.noWorkerOf("demo-1");
	await waitFor("the attachment to end with the worker", () => assert.equal(client.attachment, undefined));
	await attachSession(client, "demo-1");
	assert.equal(client.attachment?.sessionId, "demo-1");
	const replacementPid = await t.workerOf("demo-1");
	assert.notEqual(replacementPid, firstPid);
});

test(22, "discovers workers after replacing the server", { needsProcess: true }, async (t) => {
	const first = await t.makeServer();
	await t.attachClient(first, "demo-1");
	const workerPid = await t.workerOf("demo-1");
	const replacement = await t.startServer({ serverId: first.serverId, replaces: first });
	assert.equal(replacement.serverId, first.serverId);
	assert.deepEqual(t.workers("demo-1").map((w) => w.pid), [workerPid], "the worker outlives its server");
	matchObject(await runClient(t, {}, { directory: replacement.directory }), {
		kind: "list",
		sessions: [
			{ serverId: first.serverId, sessionId: "demo-1" },
			{ serverId: first.serverId, sessionId: "demo-2" },
		],
	});
	await t.attachClient(replacement, "demo-1");
	assert.deepEqual(t.workers("demo-1").map((w) => w.pid), [workerPid], "the replacement adopted the worker");
	await t.attachClient(replacement, "demo-2");
	assert.notEqual(await t.workerOf("demo-2"), workerPid);
});

test(23, "retires an unclaimed idle worker after replacement demand expires", { needsProcess: true }, async (t) => {
	const grace = { PI_SERVER_ADOPTION_GRACE_MS: "1000", __PI_SESSION_WORKER_ORPHAN_DEMAND_GRACE_MS: "1000" };
	const first = await t.makeServer({ env: grace });
	await t.attachClient(first, "demo-1");
	const workerPid = await t.workerOf("demo-1");
	await t.startServer({ serverId: first.serverId, replaces: first, env: grace });
	assert.ok(alive(workerPid), "the replacement holds the worker at first");
	await t.noWorkerOf("demo-1");
	assert.equal(alive(workerPid), false);
});

test(24, "restores tracked sessions that are outside the replacement catalog", { needsProcess: true }, async (t) => {
	const first = await t.makeServer();
	await t.attachClient(first, "demo-1");
	const workerPid = await t.workerOf("demo-1");
	const emptySessionDir = join(t.root, "sessions-empty");
	mkdirSync(emptySessionDir);
	const replacement = await t.startServer({ serverId: first.serverId, sessionDir: emptySessionDir, replaces: first });
	// pi's replacement answers only after worker discovery; ours may answer
	// before the released worker has announced itself, so the list may lag.
	await waitFor(
		"the replacement to list the adopted demo-1",
		async () =>
			assert.deepEqual(await runClient(t, {}, { directory: replacement.directory }), {
				kind: "list",
				sessions: [{ serverId: first.serverId, sessionId: "demo-1" }],
			}),
		{ interval: 50 },
	);
	await t.attachClient(replacement, "demo-1");
	assert.deepEqual(t.workers("demo-1").map((w) => w.pid), [workerPid]);
});

test(25, "reports missing and ambiguous session selections", { needsProcess: true }, async (t) => {
	const directory = join(t.root, "shared");
	const [first] = await Promise.all([
		t.startServer({ serverId: SEED_ID_1, serverDir: directory }),
		t.startServer({ serverId: SEED_ID_2, serverDir: directory }),
	]);
	await t.ensureSessions(first);
	await waitFor(
		"both servers to list demo-1",
		async () => {
			const listed = await runClient(t, {}, { directory });
			assert.equal(listed.sessions.filter((s) => s.sessionId === "demo-1").length, 2, show(listed));
		},
		{ interval: 100 },
	);
	await rejects("selecting a missing session", runClient(t, { sessionId: "missing" }, { directory }), (error) =>
		assert.match(error.message, /No discovered server contains session missing/),
	);
	await rejects("selecting an ambiguous session", runClient(t, { sessionId: "demo-1" }, { directory }), (error) =>
		assert.match(error.message, /Session demo-1 is available from more than one server/),
	);
	const sessionDir = join(t.root, "sessions");
	const missing = await t.cli(["--server-dir", directory, "--session-dir", sessionDir, "prompt", "missing", "hello"]);
	assert.notEqual(missing.code, 0);
	assert.match(missing.stderr, /No session matches missing/);
	const ambiguous = await t.cli(["--server-dir", directory, "--session-dir", sessionDir, "prompt", "demo-1", "hello"]);
	assert.notEqual(ambiguous.code, 0);
	assert.match(ambiguous.stderr, /Session demo-1 is available from more than one server/);
});

test(26, "rejects a duplicate session ID within one session directory", {}, async (t) => {
	const server = await t.makeServer();
	const client = await t.connect(server);
	const errors = [];
	const services = serverBinding(client, { services: [SessionDirectory, SessionManagement], onError: (e) => errors.push(e) });
	const directory = services.use(SessionDirectory);
	await services.ready(BG);
	const before = directory.state.value;
	const error = await rejects("creating demo-1 again", services.use(SessionManagement).create({ id: "demo-1" }, BG), (e) =>
		assert.ok(e instanceof ServerError, `a ServerError, got ${errorText(e)}`),
	);
	t.note(`duplicate create: ${errorText(error)} (pi: internal_error)`);
	await sleep(100);
	assert.deepEqual(sessionIds(directory.state.value), sessionIds(before));
	assert.deepEqual(errors.map(errorText), []);
	await services.dispose(BG);
});

// ---------------------------------------------------------------------------
// Runner

const COMPARISONS = new Set(["deepStrictEqual", "strictEqual", "notDeepStrictEqual", "notStrictEqual"]);

/** One line: the failure, with both sides of a failed comparison. */
function summary(error) {
	if (error instanceof assert.AssertionError && COMPARISONS.has(error.operator)) {
		const what = error.generatedMessage ? error.operator : error.message.split("\n")[0];
		const not = error.operator.startsWith("not") ? "not " : "";
		return `${what}: got ${show(error.actual)}, expected ${not}${show(error.expected)}`;
	}
	return errorText(error).split("\n")[0];
}

function selected(entry) {
	const filter = options.filter;
	if (filter === undefined || filter === "") return true;
	if (/^\d+(,\d+)*$/.test(filter)) return filter.split(",").map(Number).includes(entry.seed);
	return entry.name.toLowerCase().includes(filter.toLowerCase());
}

const chosen = tests.filter(selected).sort((a, b) => a.seed - b.seed);
if (chosen.length === 0) usage(`no test matches ${show(options.filter)}`);
console.log(
	connectMode
		? `# v8 seed against ${options.connect} (server ${options.serverId}), model ${options.model.provider}/${options.model.modelId}`
		: `# v8 seed against ${options.binary}, model ${options.model.provider}/${options.model.modelId}`,
);
let passed = 0;
let failed = 0;
let skipped = 0;
for (const entry of chosen) {
	if (connectMode && entry.needsProcess) {
		skipped += 1;
		console.log(`skip ${entry.name}: needs process control (not with --connect)`);
		continue;
	}
	const t = new TestContext(entry.name);
	let failure;
	try {
		await within(`${entry.name} to finish`, entry.run(t), TEST_TIMEOUT);
	} catch (error) {
		failure = error;
	}
	if (failure === undefined) {
		passed += 1;
		console.log(`ok ${entry.name}`);
	} else {
		failed += 1;
		const compared = failure instanceof assert.AssertionError && COMPARISONS.has(failure.operator);
		console.log(`FAIL ${entry.name}: ${summary(failure)}`);
		const details = [
			...(compared ? [] : errorText(failure).split("\n").slice(1)),
			...String(failure?.stack ?? "")
				.split("\n")
				.map((l) => l.trim())
				.filter((l) => l.startsWith("at ") && !l.includes("node:internal"))
				.slice(0, 4),
			...(failure instanceof AggregateError ? failure.errors.map((e) => `cause: ${errorText(e)}`) : []),
			...(failure?.cause ? [`cause: ${errorText(failure.cause)}`] : []),
			...t.logTail(),
		];
		for (const line of details) console.log(`#   ${line}`);
	}
	await t.cleanup(failure !== undefined);
}
if (skipped > 0) console.log(`# ${skipped} skipped (need process control)`);
console.log(`v8 seed: ${passed} passed, ${failed} failed`);
process.exit(failed > 0 ? 1 : 0);
