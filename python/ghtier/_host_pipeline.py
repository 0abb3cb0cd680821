"""The cpu path's update during backward (AdamW.step_in_backward with path="cpu").

As each parameter's gradient becomes final, its copy to pinned host memory starts on a copy
stream (after the compute stream's work so far), and one worker thread runs the host AdamW on it
as soon as the copy lands, then starts the new weights' copy back on an upload stream. The
backward goes on meanwhile: the main thread only queues copies. At the end of the step, the
worker's jobs are waited for and the compute stream waits for the uploads, so that the next
forward reads the new weights.

Ordering, per parameter p:
  compute stream: ... p's last backward kernels --(event "ready")
  copy stream:    wait ready -> p.grad to host --(event "copied")
  worker thread:  wait copied -> host AdamW (the GIL released) -> queue the upload
  upload stream:  wait ready -> host weights to p --(event "uploaded")
  compute stream at finish(): wait uploaded
The upload waits for "ready" because backward kernels already queued may still read p; none
queued later does (the hook fires once p's gradient is final). p.grad is recorded on the copy
stream, so freeing it (zero_grad) cannot hand its memory to another tensor before the copy.
Parameters on the CPU skip the streams: the worker updates them while the backward goes on.
"""
from __future__ import annotations

from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any, Callable, Dict, List, Optional, Tuple

import torch


class HostUpdatePipeline:
    """One step's pipeline; `submit` per parameter from the gradient hooks, `finish` once."""

    def __init__(self, worker: ThreadPoolExecutor, streams: Dict[torch.device, Tuple[Any, Any]]):
        self._worker = worker
        self._streams = streams  # the optimizer's cache: device -> (copy stream, upload stream)
        self._jobs: List[Future] = []
        self._uploaded: List[Tuple[torch.device, Any]] = []

    def submit(self, p: torch.Tensor, copy_grad: Callable[[], Any],
               update: Callable[[Optional[Any]], Optional[Any]]) -> None:
        """Start p's gradient copy (copy_grad() queues it and returns what update reads) and hand
        update to the worker; update(upload_ctx) runs the host AdamW and returns the upload's
        event, if any."""
        if p.grad is None or p.grad.device.type != "cuda":
            copy_grad()
            self._jobs.append(self._worker.submit(update, None))
            return
        dev = p.grad.device
        copy_stream, upload_stream = side_streams(self._streams, dev)
        ready = torch.cuda.Event()
        ready.record(torch.cuda.current_stream(dev))
        copy_stream.wait_event(ready)
        with torch.cuda.stream(copy_stream):
            copy_grad()
            copied = torch.cuda.Event()
            copied.record(copy_stream)
        p.grad.record_stream(copy_stream)

        def job() -> None:
            copied.synchronize()  # releases the GIL while it waits
            ev = update((upload_stream, ready))
            if ev is not None:
                self._uploaded.append((dev, ev))

        self._jobs.append(self._worker.submit(job))

    def finish(self) -> None:
        """Wait for every job (re-raising the first failure after all have ended) and order the
        compute streams after the uploads."""
        error: Optional[BaseException] = None
        for j in self._jobs:
            try:
                j.result()
            except BaseException as e:  # noqa: BLE001 - every job must end before the state is touched
                error = error or e
        self._jobs.clear()
        for dev, ev in self._uploaded:
            torch.cuda.current_stream(dev).wait_event(ev)
        self._uploaded.clear()
        if error is not None:
            raise error


def side_streams(cache: Dict[torch.device, Tuple[Any, Any]], dev: torch.device) -> Tuple[Any, Any]:
    """The copy and upload streams of `dev`, made on first use and kept in `cache`."""
    s = cache.get(dev)
    if s is None:
        s = cache[dev] = (torch.cuda.Stream(dev), torch.cuda.Stream(dev))
    return s
