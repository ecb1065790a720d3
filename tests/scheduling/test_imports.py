import subprocess
import sys


def test_scheduling_core_never_imports_torch():
    code = "import sys, dspark, dspark.scheduling; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"
