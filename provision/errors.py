"""The one exception type for errors a user can fix, and the exit codes the CLI uses."""

EXIT_OK = 0
EXIT_FAILED = 1  # a host failed or was unreachable, or a check did not pass
EXIT_USAGE = 2  # bad flags or a bad inventory: nothing was contacted
EXIT_REGRESSION = 3  # provision bench: a level fell below the baseline by more than the threshold
EXIT_PENDING = 4  # provision plan: changes are pending (nothing was changed)


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

    def __init__(self, problems: list[str]):
        self.problems = problems
        super().__init__("\n".join(problems))
