"""The launchers' command lines as torchrun and horovodrun users type them (parsers and
`--help`/`--version` only: nothing is launched)."""

import os
import subprocess
import sys

import pytest

from tensorflow_elastic import __version__
from tensorflow_elastic.launch import launcher, tensorflowrun
from tensorflow_elastic.launch.flags import spellings
from tensorflow_elastic.launch.spec import WorkerSpec, module_source
from tensorflow_elastic.rendezvous.types import NodeBounds

REPO_ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
LAUNCH = "tensorflow_elastic.distributed.launch"
RUNNER = "tensorflow_elastic.launch.tensorflowrun"


def run_module(module: str, *args: str, cwd: str = REPO_ROOT) -> subprocess.CompletedProcess:
    env = dict(os.environ, PYTHONPATH=REPO_ROOT)
    return subprocess.run([sys.executable, "-m", module, *args], cwd=cwd, env=env,
                          capture_output=True, text=True, timeout=60)


def long_flags(parser) -> list[list[str]]:
    return [[o for o in a.option_strings if o.startswith("--")] for a in parser._actions]


@pytest.mark.parametrize("parser", [launcher.build_parser(), tensorflowrun.build_parser()],
                         ids=["tfelastic-run", "tensorflowrun"])
def test_every_multi_word_flag_takes_both_spellings(parser):
    for names in long_flags(parser):
        for name in names:
            assert set(spellings(name)) <= set(names), names


@pytest.mark.parametrize("dashed, underscored, dest, value", [
    ("--nproc-per-node", "--nproc_per_node", "nproc_per_node", 2),
    ("--rdzv-endpoint", "--rdzv_endpoint", "rdzv_endpoint", "h:1"),
    ("--max-restarts", "--max_restarts", "max_restarts", 5),
    ("--monitor-interval", "--monitor_interval", "monitor_interval", 0.5),
    ("--run-id", "--run_id", "run_id", "job"),
    ("--log-dir", "--log_dir", "log_dir", "logs"),
])
def test_launcher_flags_as_torchrun_spells_them(dashed, underscored, dest, value):
    parser = launcher.build_parser()
    one = parser.parse_args([dashed, str(value), "train.py"])
    other = parser.parse_args([f"{underscored}={value}", "train.py"])
    assert getattr(one, dest) == getattr(other, dest) == value


def test_an_abbreviation_of_a_flag_with_two_spellings_is_not_ambiguous():
    assert launcher.build_parser().parse_args(["--nproc", "3", "t.py"]).nproc_per_node == 3


@pytest.mark.parametrize("module, prog", [(LAUNCH, "tfelastic-run"), (RUNNER, "tensorflowrun")])
def test_version(module, prog):
    done = run_module(module, "--version")
    assert done.returncode == 0 and done.stdout.strip() == f"{prog} {__version__}", done


@pytest.mark.parametrize("module, codes", [
    (LAUNCH, ["0 ", "1 ", "2 ", "N ", "128+S"]),
    (RUNNER, ["0 ", "1 ", "2 ", "128+S"]),
])
def test_help_documents_the_exit_codes(module, codes):
    done = run_module(module, "--help")
    assert done.returncode == 0
    section = done.stdout.split("exit codes:", 1)[1]
    assert all(f"\n  {code}" in section for code in codes), section


def test_docs_document_the_exit_codes():
    with open(os.path.join(REPO_ROOT, "docs", "reference", "exit_codes.md"), encoding="utf-8") as f:
        text = f.read()
    assert "## `tfelastic-run`" in text and "## `tensorflowrun`" in text and "128+S" in text


def test_m_runs_a_module_as_python_m(tmp_path):
    package = tmp_path / "mypkg"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "train.py").write_text("import sys\nprint(__name__, sys.argv[1:])\n")
    args = launcher.build_parser().parse_args(["-m", "mypkg.train", "--lr", "1"])
    assert args.module and args.script == "mypkg.train" and args.script_args == ["--lr", "1"]
    assert module_source("mypkg.train", str(tmp_path)) == str(package / "train.py")
    assert module_source("mypkg.missing", str(tmp_path)) is None
    spec = WorkerSpec("mypkg.train", ["--lr", "1"], "", "r", NodeBounds(1, 1), module=True)
    assert spec.command()[-4:] == ["-m", "mypkg.train", "--lr", "1"]
    done = run_module(*spec.command()[3:], cwd=str(tmp_path))
    assert done.stdout.strip() == "__main__ ['--lr', '1']", done


def test_m_finds_a_package_s_main(tmp_path):
    package = tmp_path / "app"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "__main__.py").write_text("tfe.init()\n")
    assert module_source("app", str(tmp_path)) == str(package / "__main__.py")


def test_no_python_runs_the_script_as_an_executable(tmp_path):
    spec = WorkerSpec("./run.py", ["a"], "", "r", NodeBounds(1, 1), no_python=True)
    assert spec.command() == ["./run.py", "a"] and not spec.is_python
    assert WorkerSpec("./run.py", [], "", "r", NodeBounds(1, 1)).is_python


@pytest.mark.parametrize("args, reason", [
    (["--no-python", "NOT_EXECUTABLE"], "is not an executable"),
    (["-m", "no_such_module_here"], "module 'no_such_module_here' not found"),
    (["-m", "--no-python", "x"], "give one of them"),
    (["--fork_server", "--no-python", "x"], "an executable (--no-python) cannot be"),
])
def test_m_and_no_python_check_their_script(tmp_path, monkeypatch, capsys, args, reason):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "plain.py").write_text("")
    with pytest.raises(SystemExit) as ended:
        launcher.main([str(tmp_path / "plain.py") if a == "NOT_EXECUTABLE" else a for a in args])
    assert ended.value.code == 2 and reason in capsys.readouterr().err


@pytest.mark.parametrize("args, bounds", [
    (["-np", "4"], (4, 4)),
    (["-np", "4", "--min-np", "2"], (2, 4)),
    (["--num-proc", "3", "--max_nodes", "5"], (3, 5)),
    (["--min_nodes", "1", "--max-nodes", "2"], (1, 2)),
])
def test_tensorflowrun_np_as_horovodrun(args, bounds):
    parsed = tensorflowrun.build_parser().parse_args([*args, "--hostfile", "h", "train.py"])
    got = tensorflowrun.job_bounds(parsed)
    assert (got.min_nodes, got.max_nodes) == bounds


def test_tensorflowrun_needs_a_size():
    parsed = tensorflowrun.build_parser().parse_args(["--hostfile", "h", "train.py"])
    with pytest.raises(ValueError, match="-np N, or --min_nodes and --max_nodes"):
        tensorflowrun.job_bounds(parsed)


@pytest.mark.parametrize("flag", ["--discovery", "--discovery_script", "--discovery-script",
                                  "--host-discovery-script"])
def test_tensorflowrun_discovery_script_as_horovodrun(flag):
    parsed = tensorflowrun.build_parser().parse_args(["-np", "2", flag, "./d.sh", "train.py"])
    assert parsed.discovery == "./d.sh"
