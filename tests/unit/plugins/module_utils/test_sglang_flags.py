"""Pure helpers of the sglang role: its filters and plugins/module_utils/sglang_flags.py."""

from __future__ import annotations

import shlex

from provision.paths import module_util
from tests.loaders import repo_file

sq = repo_file("plugins/filter/systemd_quote.py")
sglang_flags = module_util("sglang_flags")
rendered_values = module_util("rendered_values")

FIELDS = """
class Serving(msgspec.Struct):
    host: A[str, Arg(help="Host")] = "127.0.0.1"
    tp_size: A[int, Arg(help="TP", aliases=["--tensor-parallel-size"])] = 1
    disable_custom_all_reduce: A[bool, Arg(help="off", resolvable=True)] = False
    enforce_disable_flashinfer_allreduce_fusion: A[bool, "Enforce"] = False
    hidden: A[int, Arg(help="x", no_cli=True)] = 0
    renamed: A[Optional[str], Arg(help="x", cli_name="--other-name")] = None
    model_path: A[str, Arg(help="m", aliases=["--model"])]
"""
SERVER_ARGS = """
def add_cli_args(parser):
    parser.add_argument("--config", type=str)
    parser.add_argument("--enable-thing", action="store_true")
"""


def test_fields_become_flags_with_aliases_bools_and_cli_names():
    flags = sglang_flags.flags_from_fields_source(FIELDS)
    assert flags == {
        "--host": True,
        "--tp-size": True,
        "--tensor-parallel-size": True,
        "--disable-custom-all-reduce": False,
        "--enforce-disable-flashinfer-allreduce-fusion": False,
        "--other-name": True,
        "--model-path": True,
        "--model": True,
    }
    assert sglang_flags.flags_from_add_argument_source(SERVER_ARGS) == {"--config": True, "--enable-thing": False}


def test_unknown_flags_accept_unique_prefixes_and_skip_values():
    known = {
        **sglang_flags.flags_from_fields_source(FIELDS),
        **sglang_flags.flags_from_add_argument_source(SERVER_ARGS),
    }
    assert (
        sglang_flags.unknown_flags(["--tp", "2", "--model-path", "--weird-but-a-value", "--enable-thing"], known) == []
    )
    assert sglang_flags.unknown_flags(["--host=0.0.0.0", "--enable-thnig", "--m"], known) == ["--enable-thnig", "--m"]


# shaped as sglang 0.5.23's sglang/srt/arg_groups/argparse_actions.py and server_args.py declare them
ACTIONS = """
class DeprecatedStoreTrueAction(argparse.Action):
    def __init__(self, option_strings, dest, new_flag=None, nargs=0, const=True, default=False, **kwargs):
        super().__init__(option_strings, dest, nargs=nargs, const=const, default=default, **kwargs)

class LoRAPathAction(argparse.Action):
    def __call__(self, parser, namespace, values, option_string=None):
        setattr(namespace, self.dest, values)
"""
CUSTOM_ARGS = """
def add_cli_args(parser):
    parser.add_argument("--disable-cuda-graph", action=DeprecatedStoreTrueAction, new_flag="--x")
    parser.add_argument("--lora-paths", type=str, nargs="*", action=LoRAPathAction)
"""
OPTIONAL_FIELD = """
class Exec(msgspec.Struct):
    dllm_fdfo: A[bool, Arg(help="FDFO", action=argparse.BooleanOptionalAction)] = True
"""


def test_custom_and_boolean_optional_actions_take_a_value_only_where_argparse_gives_them_one():
    actions = sglang_flags.action_nargs_from_source(ACTIONS)
    assert actions == {"DeprecatedStoreTrueAction": 0, "LoRAPathAction": None}
    known = {
        **sglang_flags.flags_from_add_argument_source(CUSTOM_ARGS, actions),
        **sglang_flags.flags_from_fields_source(OPTIONAL_FIELD, actions),
    }
    assert known == {"--disable-cuda-graph": False, "--lora-paths": True, "--dllm-fdfo": False, "--no-dllm-fdfo": False}
    # the flag after a flag that takes no value is judged, not skipped as its value
    assert sglang_flags.unknown_flags(["--disable-cuda-graph", "--bogus-flag"], known) == ["--bogus-flag"]
    assert sglang_flags.unknown_flags(["--no-dllm-fdfo", "--bogus-flag"], known) == ["--bogus-flag"]


def test_exec_args_survive_systemd_and_shell_metacharacters():
    value = '/srv/my model; echo $HOME "q" 100% \\ end'
    quoted = sq.systemd_exec_arg(value)
    assert quoted == '"/srv/my model; echo $$HOME \\"q\\" 100%% \\\\ end"'
    # systemd's unquoting: C escapes inside double quotes, then $$ -> $ and %% -> %
    unquoted = shlex.split(quoted)[0].replace("$$", "$").replace("%%", "%")
    assert unquoted == value


def test_environment_assignment_is_quoted_as_a_whole():
    assert sq.systemd_env_assignment(("NCCL_P2P_DISABLE", "1")) == '"NCCL_P2P_DISABLE=1"'
    assert sq.systemd_env_assignment(("X", 'a "b" 5%')) == '"X=a \\"b\\" 5%%"'


def test_env_file_line_escapes_what_systemd_unescapes_in_double_quotes():
    assert sq.systemd_env_file_line(("HF_TOKEN", 'a"b\\c$D`e %f')) == 'HF_TOKEN="a\\"b\\\\c\\$D\\`e %f"'


def test_control_characters_are_refused_by_variable_name_never_by_value():
    problems = rendered_values.value_problems(
        {
            "sglang_model_path": "/m\nExecStartPre=/bin/sh -c id",
            "sglang_extra_args": ["--enable-metrics", "x\ty"],
            "sglang_environment": {"OK": "fine", "BAD": "s3cret\r", "not a name": "v"},
            "sglang_host": "127.0.0.1",
        }
    )
    assert problems == [
        "sglang_model_path holds a control character (newline, tab, ...)",
        "sglang_extra_args[1] holds a control character (newline, tab, ...)",
        "sglang_environment.BAD holds a control character (newline, tab, ...)",
        "sglang_environment: 'not a name' is not a variable name ([A-Za-z_][A-Za-z0-9_]*)",
    ]
    assert not any("s3cret" in p for p in problems)


def test_api_key_flags_are_found_in_any_spelling_argparse_accepts():
    args = ["--enable-metrics", "--api-key", "k", "--admin-api-key=k2", "--api-k", "k3", "--a", "--apis"]
    assert sq.secret_flags(args) == ["--api-key", "--admin-api-key", "--api-k"]
