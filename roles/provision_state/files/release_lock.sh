# Gives back the run's host lock at the end of a run (tasks/unlock.yml, through ansible.builtin.raw):
#   sh -c "$(cat release_lock.sh)" release_lock STATE_DIR RUN_ID CONTROLLER PID
# RUN_ID and CONTROLLER are JSON strings (quotes included), PID a number: the lock file is
# plugins/module_utils/provision_fingerprint.py's take_lock record (json.dump, sort_keys, one line), so "<key>": <value>,
# names each of the three fields that say which run holds it. Under the state directory's flock, as take_lock writes
# it, the file is removed only while it names this run; a lock another run holds by now (--break-lock) is left alone.
# In sh, not Python: a release needs no interpreter, and starting one cost 1-3 s on a slow host (a third of a no-op).
# Its builtins read and compare: flock and rm are its only programs (each start costs tens of ms on an emulated CPU).
# Prints {"lock": {"released": true|false}}.
d=$1 f=$1/lock.json released=false line=
names_this_run() {
  case $line in *"\"run_id\": $1, "*) ;; *) return 1 ;; esac
  case $line in *"\"controller\": $2, "*) ;; *) return 1 ;; esac
  case $line in *"\"pid\": $3, "*) ;; *) return 1 ;; esac
}
# a redirection of a group, not exec: a state directory that cannot be opened fails the group, not the shell
if [ -d "$d" ]; then
  {
    flock 9 && [ -f "$f" ] && { IFS= read -r line <"$f" || [ -n "$line" ]; } &&
      names_this_run "$2" "$3" "$4" && rm -f -- "$f" && released=true
  } 9<"$d"
fi
printf '{"lock": {"released": %s}}\n' "$released"
