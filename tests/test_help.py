"""The command line's help against what its options do: every option of every command has a
text, every default is shown, and every --no-x flag says what it turns off and sets the
value its help names (the texts of dptrain.config's options and of dptrain/cli.py)."""

import re

import pytest

from dptrain.cli import build_parser, default_text
from dptrain.config import option_fields

# the arguments a command needs before its options parse (its positionals)
REQUIRED = {"study": ["mnist-mlp"], "plot": ["results"]}
# what a --no-x flag's help begins with: what it turns off, never what the option does
NEGATIONS = ("no ", "never ", "skip ", "do not ")


def _commands():
    """(name, parser) of the top-level parser and of each command."""
    parser = build_parser()
    out = [("", parser)]
    for action in parser._actions:  # argparse keeps its subcommands here, nowhere public
        if action.dest == "command":
            out += sorted(action.choices.items())
    return out


COMMANDS = _commands()


def _options(parser):
    return [a for a in parser._actions if a.dest != "help"]


def _blocks(text: str) -> dict:
    """Each option's entry of a --help text, whitespace joined: {'--epochs': '...'}."""
    blocks, current = {}, None
    for line in text.splitlines():
        m = re.match(r"  (-[-\w]+|\w[-\w]*)\b", line)
        if m:
            current = m.group(1)
            blocks[current] = ""
        elif not line.startswith("  "):
            current = None  # a group's title, or the end of the list
        if current is not None:
            blocks[current] = " ".join((blocks[current] + " " + line).split())
    return blocks


@pytest.mark.parametrize("name,parser", COMMANDS, ids=[c or "top" for c, _ in COMMANDS])
def test_every_option_of_every_command_has_a_help_text(name, parser):
    missing = [a.option_strings or a.dest for a in _options(parser) if not (a.help or "").strip()]
    assert not missing, f"{name or 'python -m dptrain'}: options without help: {missing}"


@pytest.mark.parametrize("name,parser", COMMANDS, ids=[c or "top" for c, _ in COMMANDS])
def test_help_shows_every_default(name, parser):
    blocks = _blocks(parser.format_help())
    shown = 0
    for action in _options(parser):
        text = default_text(action)
        if text is None or not action.option_strings:
            continue
        entry = blocks[action.option_strings[-1]]
        assert f"(default: {text})" in entry, f"{name} {action.option_strings}: {entry!r}"
        shown += 1
    assert shown or name in ("", "info", "study")  # their options have no value by default


def test_train_help_names_the_defaults_a_user_looks_for():
    blocks = _blocks(dict(COMMANDS)["train"].format_help())
    # "default: V" as the formatter writes it, or as a help that depends on another option
    # writes it ("default: 0.1 with optimizer sgd, ...")
    for flag, value in (
        ("--epochs", "2"),
        ("--lr", "0.1"),
        ("--batch-size", "128"),
        ("--lr-schedule", "cosine"),
        ("--hidden", "256,128"),
        ("--momentum", "0.9"),
    ):
        assert f"(default: {value}" in blocks[flag], blocks[flag]
    blocks = _blocks(dict(COMMANDS)["sweep"].format_help())
    assert "(default: 5000 10000 20000 40000)" in blocks["--sizes"]
    assert "(default: 1)" in blocks["--epochs"]  # a sweep's own default, not train's 2


def _no_flags():
    out = []
    for name, parser in COMMANDS:
        for action in _options(parser):
            for flag in action.option_strings:
                if flag.startswith("--no-"):
                    out.append(pytest.param(name, parser, action, flag, id=f"{name} {flag}"))
    return out


NO_FLAGS = _no_flags()


def test_the_known_no_flags_are_all_checked():
    seen = {p.values[3] for p in NO_FLAGS}
    assert {"--no-download", "--no-shuffle", "--no-progress", "--no-mpi-shm", "--no-pin"} <= seen


@pytest.mark.parametrize("name,parser,action,flag", NO_FLAGS)
def test_a_no_flag_says_what_it_turns_off_and_does_it(name, parser, action, flag):
    text = action.help
    assert text.startswith(NEGATIONS), f"{name} {flag}: {text!r} does not say what it turns off"
    args = REQUIRED.get(name, [])
    without, with_flag = parser.parse_args(args), parser.parse_args(args + [flag])
    assert getattr(with_flag, action.dest) != getattr(without, action.dest), flag
    # a TrainConfig option's --no-x flag: its own flag, or the negation of a switch of both
    # ways (--pin / --no-pin, default None: neither given)
    field = next((f for f in option_fields() if flag in (f.metadata["flag"], _negation(f))), None)
    if field is None:  # a command's own switch (--no-ceiling, --no-model): on when given
        assert getattr(with_flag, action.dest) is True
        return
    # a TrainConfig option: the help is not the option's own text, and names what it sets
    assert (
        field.metadata["help"] not in text
        and text.split()[:3] != field.metadata["help"].split()[:3]
    ), f"{flag} describes {field.name} itself: {text!r}"
    m = re.search(r"\(dptrain\.train: (\w+)=(True|False)\)$", text)
    assert m, f"{flag}: its help names no value: {text!r}"
    assert m.group(1) == field.name == action.dest
    assert getattr(with_flag, action.dest) is (m.group(2) == "True")
    assert field.default is (None if field.type == "bool | None" else m.group(2) != "True")


def _negation(field) -> str | None:
    """--no-x of a switch of both ways (--x and --no-x), else None."""
    flag = field.metadata["flag"]
    return "--no-" + flag[2:] if field.type == "bool | None" and flag else None


def test_a_no_flag_reaches_the_config():
    from dptrain.config import config_from_args

    train = dict(COMMANDS)["train"]
    flags = ["--no-download", "--no-shuffle", "--no-progress", "--no-mpi-shm"]
    cfg = config_from_args(train.parse_args(flags))
    assert (cfg.allow_download, cfg.shuffle, cfg.progress, cfg.mpi_shm) == (False,) * 4
    cfg = config_from_args(train.parse_args([]))
    assert (cfg.allow_download, cfg.shuffle, cfg.progress, cfg.mpi_shm) == (True,) * 4
