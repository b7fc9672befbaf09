"""The GPU's utilization while a side runs, from `nvidia-smi dmon -s u` (one line a second):
SM and JPEG-engine (jpg) percentages, averaged over the run and at their peak. The JPEG column
shows whether the server's GPU decode ran on the engines (issue 23)."""

import shutil
import subprocess


class Dmon:
    """Samples GPU `index` while in a `with` block; .summary() after it. Never fails a run: without
    nvidia-smi, or with a driver whose dmon has no jpg column, the figures are None."""

    def __init__(self, index):
        self.index = index
        self.proc = None
        self.lines = []

    def __enter__(self):
        if self.index is not None and shutil.which("nvidia-smi"):
            self.proc = subprocess.Popen(
                ["nvidia-smi", "dmon", "-s", "u", "-d", "1", "-i", str(self.index)],
                stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
        return self

    def __exit__(self, *exc):
        if self.proc is not None:
            self.proc.terminate()
            try:
                out, _ = self.proc.communicate(timeout=5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                out, _ = self.proc.communicate()
            self.lines = out.splitlines()
        return False

    def summary(self):
        """{"sm_pct_mean", "sm_pct_max", "jpg_pct_mean", "jpg_pct_max", "samples"}; None values
        where the column is missing."""
        header = next((ln.lstrip("#").split() for ln in self.lines if ln.startswith("#")), [])
        rows = [ln.split() for ln in self.lines if ln.strip() and not ln.startswith("#")]
        out = {"samples": len(rows)}
        for name in ("sm", "jpg"):
            col = header.index(name) if name in header else None
            values = []
            for r in rows:
                if col is not None and col < len(r) and r[col].isdigit():
                    values.append(int(r[col]))
            out[f"{name}_pct_mean"] = round(sum(values) / len(values), 1) if values else None
            out[f"{name}_pct_max"] = max(values) if values else None
        return out
