#!/usr/bin/env bash
# complete.bash WORD...: what bash's completion of `pi-server completions
# bash` offers for the command line WORD... (its last word being completed),
# space-separated. `pi-server` must be on PATH.
set -euo pipefail
source <(pi-server completions bash)
COMP_WORDS=("$@")
COMP_CWORD=$(($# - 1))
COMP_LINE="$*"
COMP_POINT=${#COMP_LINE}
previous=""
if (($# > 1)); then previous="${COMP_WORDS[COMP_CWORD - 1]}"; fi
"$(complete -p pi-server | sed -E 's/.* -F ([^ ]+) .*/\1/')" pi-server "${COMP_WORDS[COMP_CWORD]}" "$previous"
echo "${COMPREPLY[*]}"
