"""The one exception type for errors a user can fix, and the exit codes the CLI uses."""

import re

EXIT_OK = 0
EXIT_FAILED = 1  # a host failed or was unreachable, or a check did not pass
EXIT_USAGE = 2  # bad flags or a bad inventory: nothing was contacted
EXIT_REGRESSION = 3  # provision bench: a level fell below the baseline by more than the threshold
EXIT_PENDING = 4  # provision plan: changes are pending (nothing was changed)
# SIGINT, SIGTERM or SIGHUP stopped the command: 128 + the signal's number, as a shell reports it (130, 143, 129)
EXIT_SIGNAL_BASE = 128


# ansible-core 2.19 names the types of the values it read by their internal tagged classes
_TAGGED_TYPE = re.compile(r"<class '(?:[\w.]+\.)?_AnsibleTagged(\w+)'>|(?<=')_AnsibleTagged(\w+)(?=')")


def one_line(text: object, limit: int | None = None) -> str:
    """A message as one line: whitespace (newlines, a host's wrapped output) folded, bytes that are not text (a
    binary file's) shown escaped, Ansible's tagged types by their YAML names (`_AnsibleTaggedList` is a list);
    cut at `limit` characters when one is given."""
    line = " ".join(str(text).encode("utf-8", "backslashreplace").decode("utf-8").split())
    line = _TAGGED_TYPE.sub(lambda m: (m[1] or m[2]).lower(), line)
    return line[:limit] if limit else line


class ProvisionError(Exception):
    """An error the user can fix. Its message names the file, host and variable involved.

    The CLI prints it on one line, without a traceback, and exits with `exit_code`.
    """

    exit_code = EXIT_FAILED


class UsageError(ProvisionError):
    """Bad command-line usage or an invalid inventory; raised before any host is contacted."""

    exit_code = EXIT_USAGE


class InventoryError(UsageError):
    """One or more problems in an inventory. `problems` holds one line per problem."""

    def __init__(self, problems: list[str], secrets: frozenset[str] = frozenset()):
        self.problems = problems
        self.secrets = secrets  # the inventory's secrets as far as it could be read: the lines are scrubbed of them
        super().__init__("\n".join(problems))


class Signalled(BaseException):
    """SIGTERM or SIGHUP outside a run (a run traps them: Interrupted), raised where the main thread is, as Python
    raises KeyboardInterrupt for SIGINT: every `finally` runs, and the CLI still prints its line and envelope."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = signum


class Interrupted(ProvisionError):
    """SIGINT or SIGTERM stopped a run; its record was written. Exits 128 + the signal's number. `result` and
    `hosts` are what the --json envelope carries (the run's summary and each host's state), when known."""

    def __init__(self, message: str, signum: int, result: dict | None = None, hosts: dict | None = None):
        super().__init__(message)
        self.exit_code = EXIT_SIGNAL_BASE + signum
        self.result = result or {}
        self.hosts = hosts or {}


# a blank --limit: Ansible would run on every host of the inventory
EMPTY_LIMIT = "--limit is empty: it would reach every host of the inventory; name the hosts, or leave --limit out"
