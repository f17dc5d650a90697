"""Planning and rendering work where torch cannot be imported (a subprocess whose `import torch` fails)."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def no_torch_env(tmp_path):
    """An environment in which `import torch` raises ImportError: a fake torch package first on the path."""
    fake = tmp_path / "fake_site" / "torch"
    fake.mkdir(parents=True)
    (fake / "__init__.py").write_text('raise ImportError("torch is hidden for this test")\n')
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(fake.parent), str(ROOT), *filter(None, [env.get("PYTHONPATH")])])
    return env


def run(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)


def test_torch_really_is_hidden(no_torch_env):
    r = run(["-c", "import torch"], no_torch_env)
    assert r.returncode != 0 and "torch is hidden for this test" in r.stderr


def test_plan_and_render_without_torch(no_torch_env):
    code = (
        "import sys\n"
        "from generator import Gemm\n"
        "p = Gemm('bf16', 'tn', arch=80)\n"
        "print(p)\n"
        "p.stages = 3\n"
        "files = p.render()\n"
        "assert files and all(name.endswith('.cu') and text for name, text in files.items()), files.keys()\n"
        "print('FILES', *files)\n"
        "assert 'torch' not in sys.modules\n"
    )
    r = run(["-c", code], no_torch_env)
    assert r.returncode == 0, r.stderr
    assert "name:         sm80_bf16_tn_" in r.stdout
    assert "FILES sm80_bf16_tn_" in r.stdout


def test_cli_plan_and_render_without_torch(no_torch_env, tmp_path):
    r = run(["-m", "generator", "plan", "--dtype", "bf16", "--layout", "tn", "--arch", "80"], no_torch_env)
    assert r.returncode == 0, r.stderr
    assert "name: " in r.stdout
    out = tmp_path / "out"
    r = run(["-m", "generator", "render", "--dtype", "bf16", "--layout", "tn", "--arch", "80", "--out", str(out)],
            no_torch_env)
    assert r.returncode == 0, r.stderr
    written = [Path(line) for line in r.stdout.splitlines() if line.strip()]
    assert written and all(p.is_file() for p in written)


def test_arch_none_without_torch_says_to_pass_an_arch(no_torch_env):
    code = (
        "from generator import Gemm\n"
        "try:\n"
        "    Gemm('bf16', 'tn')\n"
        "except Exception as err:\n"
        "    print(type(err).__name__, err)\n"
        "else:\n"
        "    raise SystemExit('no error')\n"
    )
    r = run(["-c", code], no_torch_env)
    assert r.returncode == 0, r.stderr
    assert "arch=80" in r.stdout and "arch=90" in r.stdout
    assert "torch" in r.stdout  # says why it could not detect the GPU


def test_cli_without_arch_and_without_torch_exits_2(no_torch_env):
    r = run(["-m", "generator", "plan"], no_torch_env)
    assert r.returncode == 2
    assert r.stderr.startswith("error: ")
    assert "--arch 80" in r.stderr and "--arch 90" in r.stderr
    assert "Traceback" not in r.stderr
