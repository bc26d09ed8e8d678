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

KERNEL_STILL_STARTING = """\
[E 2026-11-28 23:38:12.504 ServerApp] Uncaught exception GET /api/kernels?1764372492496 (127.0.0.1)
    HTTPServerRequest(protocol='http', host='127.0.0.1:41533', method='GET', uri='/api/kernels?1764372492496')
    Traceback (most recent call last):
      File "traitlets/traitlets.py", line 652, in get
        value = obj._trait_values[self.name]
                ~~~~~~~~~~~~~~~~~^^^^^^^^^^^
    KeyError: 'last_activity'

    During handling of the above exception, another exception occurred:

    Traceback (most recent call last):
      File "tornado/web.py", line 2004, in _execute
        result = await result
      File "jupyter_server/services/kernels/handlers.py", line 41, in get
        kernels = await ensure_async(km.list_kernels())
      File "jupyter_server/services/kernels/kernelmanager.py", line 558, in list_kernels
        model = self.kernel_model(kernel_id)
      File "jupyter_server/services/kernels/kernelmanager.py", line 544, in kernel_model
        "last_activity": isoformat(kernel.last_activity),
      File "traitlets/traitlets.py", line 740, in _validate
        value = self.validate(obj, value)
    traitlets.traitlets.TraitError: The 'last_activity' trait of a ServerKernelManager instance expected a datetime
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


def test_a_kernel_listed_while_it_starts_is_not_reported_and_a_later_error_is() -> None:
    """jupyter_server's race (browser_support.KERNEL_STILL_STARTING): both tracebacks of its chain are left out."""
    assert reported_tracebacks(KERNEL_STILL_STARTING.splitlines()) == []
    after = reported_tracebacks((KERNEL_STILL_STARTING + KERNEL_ERROR).splitlines())
    assert len(after) == 1 and "something the course did" in after[0]
    listed = KERNEL_STILL_STARTING.replace("kernel.last_activity", "kernel.execution_state")  # another failure
    assert len(reported_tracebacks(listed.splitlines())) == 2
