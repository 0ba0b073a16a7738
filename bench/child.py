"""A fresh process that runs one pickled call: `python -P bench/child.py CALL RESULT` (`bench.common.in_fresh_process`).

CALL holds two pickles: the parent's `sys.path`, then `(function, args)`; RESULT receives `(True, value)` or
`(False, "ErrorType: message")`. The child imports this module and what the call's pickle names, nothing else: a
multiprocessing spawn child would re-run the parent's entry module (`python -m bench.ops` as `__mp_main__`),
loading TVM into a torch program's child. So a torch program's child loads torch (`bench.timing_torch`, the
factory's module), a TVM program's child TVM (`bench.timing_tvm`), an ONNX model's ONNX Runtime
(`bench.timing_onnx`). What the call names must live in a module, not in the entry script's `__main__`.
"""

from __future__ import annotations

import pickle
import sys


def main(argv: list[str]) -> int:
    call_path, result_path = argv
    with open(call_path, "rb") as f:
        sys.path[:] = pickle.load(f)
        try:
            fn, args = pickle.load(f)
            outcome = (True, fn(*args))
        except Exception as e:  # noqa: BLE001 - the parent reports it and times the other programs
            outcome = (False, f"{type(e).__name__}: {e}")
    with open(result_path, "wb") as f:
        pickle.dump(outcome, f)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
