"""The planner's default sm90 kernel, disassembled with cuobjdump: its main loop must issue HGMMA
(wgmma), not HMMA (mma.sync). Prints the count of each and the loop's HGMMA shapes."""
from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from generator import Gemm  # noqa: E402
from generator.toolchain import build  # noqa: E402
from generator.runtime import build_request  # noqa: E402


def main() -> int:
    cuobjdump = shutil.which("cuobjdump")
    if cuobjdump is None:
        print("cuobjdump not found (pip install nvidia-cuda-cuobjdump)")
        return 2
    plan = Gemm("bf16", "tn", arch=90)
    result = build(build_request(plan.config, target=90))
    sass = subprocess.run([cuobjdump, "-sass", "-fun", plan.name, str(result.library)], capture_output=True,
                          text=True, check=True).stdout
    hgmma = re.findall(r"HGMMA\.(\S+)", sass)
    hmma = re.findall(r"\bHMMA\.", sass)
    print(f"{plan.name}: {len(hgmma)} HGMMA ({', '.join(sorted(set(hgmma)))}), {len(hmma)} HMMA")
    return 0 if hgmma and not hmma else 1


if __name__ == "__main__":
    sys.exit(main())
