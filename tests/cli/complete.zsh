#!/usr/bin/env zsh
# complete.zsh LINE: what zsh's completion system, with `pi-server
# completions zsh` sourced, offers for LINE followed by a Tab, one per line.
# It drives an interactive zsh in a pseudo-terminal (zsh/zpty) and records
# every candidate the completion function adds. `pi-server` must be on PATH.
zmodload zsh/zpty
zpty z zsh -f -i
zpty -w z 'PS1="<ps1>"; autoload -U compinit; compinit -u -D'
zpty -w z 'source <(pi-server completions zsh)'
zpty -w z 'compadd() { if [[ ${@[1,(i)(-|--)]} == *-(O|A|D)\ * ]]; then builtin compadd "$@"; return $?; fi; local -a __hits; builtin compadd -A __hits "$@"; local h; for h in $__hits; do print -r -- "<hit>$h"; done; builtin compadd "$@"; }'
zpty -w z 'zstyle ":completion:*" list-prompt ""; zstyle ":completion:*" menu no; print -r -- "<ready>"'
local line
while zpty -r z line; do [[ $line == *"<ready>"* && $line != *print* ]] && break; done
# The next prompt: the line editor reads keys now (typed earlier, a Tab
# would be a plain character to the terminal).
zpty -r z line '*<ps1>*'
zpty -w -n z "$1"$'\t'
zpty -w z $'\C-u print -r -- "<done>"'
while zpty -r z line; do
  [[ $line == *"<done>"* && $line != *print* ]] && break
  [[ $line == *"<hit>"* ]] && print -r -- "${${line##*<hit>}%%$'\r'}"
done
zpty -d z
