"""Helpers the tests share: plain functions, classes and factories (fixtures stay in the conftest.py files).

`tests/` is on `sys.path` while the suite runs (its conftest.py sits there, outside a package), so a test
imports these as `from support.jobs import add_operator_job`.

- `auth`: tokens and the `Authorization` header
- `servers`: the API (and a worker) on a loopback port, in threads of the test process
- `processes`: `altune serve` / `altune worker` as child processes, and waiting on them
- `jobs`: job rows as the API or a worker writes them, and polling a job until it ends
- `models`: torch.export programs saved to files or bytes, and uploading them
- `fake_tuner`: a stand-in for `tuner.tune` with a steady pace (the dashboard's tests)
"""
