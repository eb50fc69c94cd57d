"""A table of the mistakes a new user makes, walked through the real CLI entry point: each
exits 2 with exactly one line on stderr that names what is wrong and, where there is one, the
fix (the close option, setting or command; the parser's reason and line for a YAML file)."""

from __future__ import annotations

from pathlib import Path

import pytest

from specwatch.__main__ import main as cli_main

FILES = {
    "typo.yaml": "targt:\n  - name: a\n",
    "nested.yaml": "targets:\n  - name: a\n    url: http://127.0.0.1:1\n    max_num_seq: 3\n",
    "broken.yaml": "targets:\n  - name: a\n   url: [\n",
    "badjson.json": '{"targets": [}\n',
}

MISTAKES: list[tuple[list[str], str]] = [
    (["run", "--targt", "std=http://h:8000"],
     "specwatch run: unrecognized argument --targt; did you mean --target?"),
    (["demo", "--duraton", "5"],
     "specwatch demo: unrecognized argument --duraton; did you mean --duration?"),
    (["rnu"], "specwatch: unknown command 'rnu'; did you mean run?"),
    ([], "specwatch: a command is needed, one of run, analyze, replay, record, advise, simulate, "
         "demo, paired-test, power, report, fleet, doctor, bench-result (specwatch --help)"),
    (["run", "--config", "{tmp}/typo.yaml"],
     "specwatch run: config error: targt: unknown setting; did you mean 'targets'?"),
    (["run", "--config", "{tmp}/nested.yaml"],
     "specwatch run: config error: targets.0.max_num_seq: unknown setting; "
     "did you mean 'max_num_seqs'?"),
    (["run", "--config", "{tmp}/broken.yaml"],
     "specwatch run: config file {tmp}/broken.yaml:3: while parsing a block collection: "
     "expected <block end>, but found '<block mapping start>'"),
    (["run", "--config", "{tmp}/badjson.json"],
     "specwatch run: config file {tmp}/badjson.json:1: Expecting value"),
    (["run", "--config", "{tmp}/missing.yaml"],
     "specwatch run: config file {tmp}/missing.yaml: No such file or directory"),
    (["run"], "specwatch run: config error: targets: at least one --target is required"),
    (["run", "--target", "http://h:8000"],
     "specwatch run: --target 'http://h:8000': expected NAME=URL[,key=value...]"),
    (["demo", "--port", "abc"], "specwatch demo: argument --port: invalid int value: 'abc'"),
    (["demo", "--duration", "0"], "specwatch demo: --duration must be longer than 0 s"),
]  # fmt: skip


@pytest.mark.parametrize(("argv", "line"), MISTAKES, ids=[" ".join(a) or "-" for a, _ in MISTAKES])
def test_each_mistake_exits_2_with_one_line_naming_the_fix(
    argv: list[str], line: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The exit status is 2 and stderr is the one expected line (stdout stays empty)."""
    for name, text in FILES.items():
        (tmp_path / name).write_text(text, encoding="utf-8")
    args = [a.replace("{tmp}", str(tmp_path)) for a in argv]
    try:
        rc = cli_main(args)
    except SystemExit as exc:  # argparse exits from inside parse_args
        rc = exc.code  # type: ignore[assignment]
    out, err = capsys.readouterr()
    assert rc == 2
    assert err.splitlines() == [line.replace("{tmp}", str(tmp_path))]
    assert out == ""
