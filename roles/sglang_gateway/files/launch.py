"""Start SGLang's gateway (smg) with its keys and workers read from files, never from its command line.

    launch.py CONFIG_DIR [--check] -- SMG_LAUNCH_FLAGS...

`smg launch --api-key KEY` would show the key to every user of the host in /proc/PID/cmdline, and the unit file would
hold it. So the unit starts this script with smg's other flags; the script reads CONFIG_DIR/secrets.json (the API key,
readable by the gateway's user only), CONFIG_DIR/control-plane-key (the key worker changes need) and
CONFIG_DIR/workers.json (the workers to start with), hands all of them to smg's own argument parser in memory, and
runs the gateway in this process through smg's Python API (smg.launch_router). The process's command line is this
script's, which smg then retitles `smg::router`.

With --check it only parses: smg's parser refuses an unknown flag with its own message and exit status 2, which is
how the role checks the flags against the installed wheel before it writes the unit.
"""

import json
import sys
from pathlib import Path

KEY_FLAGS = ("--api-key", "--control-plane-api-keys", "--tenant-api-key", "--worker-urls")


def _json(path, default):
    try:
        return json.loads(path.read_text())
    except FileNotFoundError:
        return default


def smg_argv(config_dir, flags):
    """smg's argv: the flags, then the workers and the keys from the files."""
    given = [flag for flag in flags if flag.split("=", 1)[0] in KEY_FLAGS]
    if given:
        sys.exit(f"launch.py: {', '.join(given)} must not be given on the command line; the role writes them to files")
    argv = list(flags)
    workers = _json(config_dir / "workers.json", [])
    if workers:
        argv += ["--worker-urls", *workers]
    key = _json(config_dir / "secrets.json", {}).get("api_key") or ""
    if key:
        argv += ["--api-key", key]
    control = config_dir / "control-plane-key"
    if control.exists():
        argv += ["--control-plane-api-keys", control.read_text().strip()]
    return argv


def main(argv):
    if len(argv) < 2 or "--" not in argv:
        sys.exit(__doc__.split("\n\n")[1].strip())
    split = argv.index("--")
    own, flags = argv[:split], argv[split + 1 :]
    config_dir, check = Path(own[0]), "--check" in own[1:]
    from smg.launch_router import launch_router, parse_router_args

    args = parse_router_args(smg_argv(config_dir, flags))
    if check:
        print(json.dumps({"workers": len(args.worker_urls or []), "api_key": bool(args.api_key)}))
        return
    launch_router(args)


if __name__ == "__main__":
    main(sys.argv[1:])
