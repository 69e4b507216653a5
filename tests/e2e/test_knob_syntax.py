"""One knob syntax everywhere (tclang/options.py): a knob string, every command's knob
flags, `tclang compare --manual` and `repr(tc.Options)` read and write the same grammar,
every knob from every command, and `--tuned` takes what the tuning database stored."""

from __future__ import annotations

from dataclasses import fields
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

import tclang as tc
from tclang.cli import commands
from tclang.cli import _parser, main
from tclang.options import KNOBS, FUSIONS, Options, format_knob, format_knobs, parse_knobs

EXAMPLE = str(Path(__file__).resolve().parents[2] / "examples" / "operators.tc")
SWITCHES = [k for k, kind in KNOBS.items() if kind == "switch" and k != "specialize"]
PARSER = _parser()  # (building it imports every command: once)


def maybe(strategy):
    return st.none() | strategy


sizes = st.lists(st.integers(0, 512), min_size=1, max_size=4).map(tuple)
positive = st.lists(st.integers(1, 1024), min_size=1, max_size=3).map(tuple)
orders = st.lists(st.sampled_from("ijkmnbc"), min_size=1, max_size=4, unique=True) | \
    st.lists(st.integers(0, 5), min_size=1, max_size=4, unique=True)

options = st.builds(
    Options,
    fusion=maybe(st.sampled_from(FUSIONS)),
    tile=maybe(sizes | st.integers(0, 512) | st.just(())),
    unroll=maybe(st.integers(1, 64)),
    specialize=st.booleans(),
    loop_order=maybe(orders.map(tuple)),
    vector_width=maybe(st.sampled_from([1, 2, 4, 8, 16, 32, 64])),  # powers of two
    block=maybe(positive), grid=maybe(positive),
    register_tile=maybe(st.just(False) | st.tuples(st.integers(1, 16), st.integers(1, 64))),
    compile_budget=maybe(st.integers(1, 3600) | st.floats(
        min_value=0, exclude_min=True, allow_nan=False, allow_infinity=False)),
    **{k: maybe(st.booleans()) for k in SWITCHES})


def test_every_field_of_options_is_a_knob_with_a_flag_on_every_command():
    assert list(KNOBS) == [f.name for f in fields(Options)]
    subcommands = PARSER._subparsers._group_actions[0].choices
    for command in ("explain", "run", "export", "compare"):
        flags = {a.dest: a.option_strings for a in subcommands[command]._actions}
        for knob in KNOBS:
            assert flags[f"knob_{knob}"] == ["--" + knob.replace("_", "-")], command


def set_knobs(o: Options) -> list[str]:
    return [f.name for f in fields(o) if getattr(o, f.name) != f.default]


@settings(max_examples=200)
@given(options)
def test_every_knob_round_trips_through_a_knob_string_and_repr(o):
    text = format_knobs(o)
    assert parse_knobs(text) == o
    assert Options.parse(text) == o
    assert text.count("=") == len(set_knobs(o))  # only what is set
    assert eval(repr(o), {"Options": Options}) == o
    assert repr(o) == (f"Options.parse({text!r})" if text else "Options()")
    from tclang.tuning.compare import parse_manual  # tc.compare's manual= specs
    assert parse_manual(text) == o


@settings(max_examples=200)
@given(options, st.sampled_from(["explain", "run", "export", "compare"]))
def test_every_knob_round_trips_through_the_flags_of_every_command(o, command):
    argv = [command, "k.tc"] + (["-o", "out"] if command == "export" else [])
    for knob in set_knobs(o):
        argv += [f"--{knob.replace('_', '-')}", format_knob(knob, getattr(o, knob))]
    args = PARSER.parse_args(argv)
    got = commands.knobs_options(commands._knob_pairs(args))
    assert got == o


def test_the_older_spellings_still_work():
    new = Options(tile=(32, 32, 64), loop_order=("k", "m", "n"), register_tile=(4, 16),
                  unroll=4)
    assert parse_knobs("tile=32,32,64,loop_order=k,m,n,register_tile=4,16,unroll=4") == new
    assert parse_knobs("tile=32x32x64, loop_order=k:m:n, register_tile=4x16, unroll=4") \
        == new
    args = _parser().parse_args(["run", "k.tc", "--tile", "32,32,64", "--loop-order",
                                 "k,m,n", "--register-tile", "4,16", "--unroll", "4"])
    assert commands._options(args) == new
    args = _parser().parse_args(["run", "k.tc", "--generic", "--register-tile", "off",
                                 "--pack", "off", "--parallel", "--reorder-reductions",
                                 "off"])
    assert commands._options(args) == Options(specialize=False, register_tile=False,
                                              pack=False, parallel=True,
                                              reorder_reductions=False)
    assert parse_knobs("tile=none") == Options(tile=()) == parse_knobs("tile=off")
    assert parse_knobs("tile=32x...") == Options(tile=32)  # every member


def test_flags_override_the_options_string():
    args = _parser().parse_args(["explain", "k.tc", "--options", "tile=8x8,unroll=2",
                                 "--unroll", "4", "--vector-width", "8"])
    assert commands._options(args) == Options(tile=(8, 8), unroll=4, vector_width=8)


@pytest.mark.parametrize("bad, words", [("tile=32xx", "not an integer"),
                                        ("tiles=4", r"unknown knob 'tiles' \(did you mean tile"),
                                        ("unroll", "not name=value"),
                                        ("pack=maybe", "on or off"),
                                        ("fusion=most", "fusion must be one of"),
                                        ("tile=4,tile=8x8", None)])
def test_a_bad_knob_string_is_a_schedule_error_naming_it(bad, words):
    if words is None:  # the same knob twice: the later one wins, as flags do
        assert parse_knobs(bad) == Options(tile=(8, 8))
        return
    with pytest.raises(tc.TCScheduleError, match=words):
        parse_knobs(bad)


def test_a_bad_knob_flag_is_a_usage_error_with_the_message(capsys):
    """As every number a flag does not take (tests/e2e/test_cli_arguments.py): argparse's
    usage message and exit 2, the knob grammar's words in it, no traceback."""
    with pytest.raises(SystemExit) as info:
        main(["run", EXAMPLE, "--entry", "matmul", "--sizes", "M=4,K=4,N=4",
              "--vector-width", "wide"])
    err = capsys.readouterr().err
    assert info.value.code == 2 and "argument --vector-width: expected a whole number" in err
    assert "vector_width: 'wide' is not an integer" in err and "Traceback" not in err
    with pytest.raises(SystemExit) as info:
        main(["run", EXAMPLE, "--entry", "matmul", "--fusion", "most"])
    assert info.value.code == 2 and "argument --fusion: expected one of" in \
        capsys.readouterr().err


def store_tuned(kernel, inputs, options: Options, database: Path) -> None:
    """What tc.autotune stores for `kernel` at the shapes of `inputs`, without tuning."""
    from tclang.runtime.arguments import bind_arguments
    from tclang.driver.cachekey import canonical_source
    from tclang.driver.compiler import compile_target
    from tclang.driver.tuning_database import TuningDatabase, kernel_key, machine_id
    shapes = bind_arguments(kernel.definition, inputs, False).shape_key()
    key = kernel_key(canonical_source(kernel.definition), kernel.name, shapes, "cpu")
    machine = machine_id(compile_target("cpu", Options()))
    assert TuningDatabase(database).save(key, machine, kernel.name, shapes, options,
                                         1e-6, 2e-6, [])


def test_tuned_takes_the_stored_options_in_explain_run_and_export(tmp_path, monkeypatch,
                                                                  capsys):
    database = tmp_path / "tuning.sqlite"
    monkeypatch.setenv("TCLANG_TUNING_DB", str(database))
    kernel = tc.define(Path(EXAMPLE).read_text()).matmul
    rng = np.random.default_rng(0)  # what the commands' random_inputs make: same shapes
    inputs = (rng.standard_normal((12, 8), np.float32), rng.standard_normal((8, 16), np.float32))
    assert kernel.tuned_options(*inputs) is None
    stored = Options(tile=(4, 8, 8), unroll=2)
    store_tuned(kernel, inputs, stored, database)
    assert kernel.tuned_options(*inputs) == stored
    sizes = ["--entry", "matmul", "--sizes", "M=12,K=8,N=16"]
    assert main(["explain", EXAMPLE, *sizes, "--tuned", "--no-limits"]) == 0
    out = capsys.readouterr().out
    assert "options     tile=4x8x8,unroll=2" in out
    assert main(["run", EXAMPLE, *sizes, "--tuned", "--repeat", "1"]) == 0
    assert "): matches" in capsys.readouterr().out  # checked (NumPy or the interpreter)
    assert main(["run", EXAMPLE, *sizes, "--tuned", "--tile", "4"]) == 1
    assert "--tuned uses the stored options" in capsys.readouterr().err
    assert main(["export", EXAMPLE, *sizes, "--tuned", "-o", str(tmp_path / "lib")]) == 0
    assert "libtclang_matmul.so" in capsys.readouterr().out
    tuned = tc.define(Path(EXAMPLE).read_text(), options="tuned").matmul
    with pytest.raises(tc.TCArgumentError, match="stored per shape"):
        tuned.export(tmp_path / "generic", None)
