"""The real API on a loopback port (uvicorn), and a worker, in threads of the test process."""

from __future__ import annotations

import socket
import threading
import time

import uvicorn

from service.api import create_app
from service.settings import Settings
from service.worker import Worker


def free_port() -> int:
    """A loopback port free now (the kernel's pick), for a server this test starts."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LiveServer:
    """The real API on a loopback port and, with `worker=True`, one worker, both in threads of this process.

    `log_config` is uvicorn's (`service.cli.serve_log_config()` for the access log `altune serve` writes); without
    it uvicorn logs warnings only. Open event streams get 2 s to end when the server stops.
    """

    def __init__(self, settings: Settings, *, worker: bool = True, log_config: dict | None = None) -> None:
        self.settings = settings
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        logs = {"log_config": log_config, "log_level": "info"} if log_config else {"log_level": "warning"}
        self.server = uvicorn.Server(uvicorn.Config(create_app(settings), host="127.0.0.1", port=self.port,
                                                    timeout_graceful_shutdown=2, **logs))
        self.worker = Worker(settings) if worker else None
        self._threads = [threading.Thread(target=self.server.run, daemon=True)]
        if self.worker is not None:
            self._threads.append(threading.Thread(target=self.worker.run_forever, daemon=True))

    def __enter__(self) -> LiveServer:
        for t in self._threads:
            t.start()
        deadline = time.monotonic() + 30
        while not self.server.started:
            assert time.monotonic() < deadline, "server did not start in 30 s"
            time.sleep(0.02)
        return self

    def __exit__(self, *exc) -> None:
        if self.worker is not None:
            self.worker.stop()
        self.server.should_exit = True
        for t in self._threads:
            t.join(60)
