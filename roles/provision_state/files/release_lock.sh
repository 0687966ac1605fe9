# Gives back the run's host lock at the end of a run (tasks/unlock.yml, through ansible.builtin.raw):
#   sh -c "$(cat release_lock.sh)" release_lock STATE_DIR RUN_ID CONTROLLER PID
# RUN_ID and CONTROLLER are JSON strings (quotes included), PID a number: the lock file is
# plugins/module_utils/provision_fingerprint.py's take_lock record (json.dump, sort_keys), so "<key>": <value>, names
# each of the three fields that say which run holds it. Under the state directory's flock, as take_lock writes it,
# the file is removed only while it names this run; a lock another run holds by now (--break-lock) is left alone.
# In sh, not Python: a release needs no interpreter, and starting one cost 1-3 s on a slow host (a third of a no-op).
# Prints {"lock": {"released": true|false}}.
d=$1
released=false
if [ -d "$d" ] && flock "$d" sh -c 'grep -qF -- "\"run_id\": $2, " "$1" && grep -qF -- "\"controller\": $3, " "$1" &&
    grep -qF -- "\"pid\": $4, " "$1" && rm -f -- "$1"' release_lock "$d/lock.json" "$2" "$3" "$4"; then
  released=true
fi
printf '{"lock": {"released": %s}}\n' "$released"
