"""The browser test's reading of the notebook server's log (browser_support.reported_tracebacks); no browser needed."""

from __future__ import annotations

from browser_support import reported_tracebacks

# Both excerpts as the notebook server's log had them on a loaded machine (paths shortened).
CLOSED_PAGE_WRITE = """\
[I 2026-11-27 02:01:27.256 ServerApp] Kernel shutdown: 6e22334c-3a23-42ba-a4a9-878f580aa84b
Task exception was never retrieved
future: <Task finished name='Task-2050' coro=<WebSocketProtocol13.write_message.<locals>.wrapper() done, defined at tornado/websocket.py:1138> exception=WebSocketClosedError()>
Traceback (most recent call last):
  File "tornado/websocket.py", line 1140, in wrapper
    await fut
tornado.iostream.StreamClosedError: Stream is closed

During handling of the above exception, another exception occurred:

Traceback (most recent call last):
  File "tornado/websocket.py", line 1142, in wrapper
    raise WebSocketClosedError()
tornado.websocket.WebSocketClosedError
[I 2026-11-27 02:01:32.046 LabApp] Build is up to date
"""

WORKER_HEARTBEAT = """\
2026-11-27 00:19:40,101 - distributed.worker - ERROR - Failed to communicate with scheduler during heartbeat.
Traceback (most recent call last):
  File "distributed/comm/tcp.py", line 226, in read
    frames_nosplit_nbytes_bin = await stream.read_bytes(fmt_size)
tornado.iostream.StreamClosedError: Stream is closed

The above exception was the direct cause of the following exception:

Traceback (most recent call last):
  File "distributed/worker.py", line 1165, in heartbeat
    response = await retry_operation(
distributed.comm.core.CommClosedError: in <TCP (closed) ConnectionPool.heartbeat_worker>: Stream is closed
"""

KERNEL_ERROR = """\
[IPKernelApp] ERROR | Exception in message handler:
Traceback (most recent call last):
  File "ipykernel/kernelbase.py", line 412, in dispatch_shell
ValueError: something the course did
"""


def test_a_write_to_a_closed_page_is_not_reported_and_everything_else_is() -> None:
    assert reported_tracebacks(CLOSED_PAGE_WRITE.splitlines()) == []
    assert len(reported_tracebacks(WORKER_HEARTBEAT.splitlines())) == 2  # both tracebacks of the chain
    after = reported_tracebacks((CLOSED_PAGE_WRITE + KERNEL_ERROR).splitlines())
    assert len(after) == 1 and "something the course did" in after[0]
    before = reported_tracebacks((KERNEL_ERROR + CLOSED_PAGE_WRITE).splitlines())
    assert len(before) == 1 and "something the course did" in before[0]
