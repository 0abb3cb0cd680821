"""The gpu_link update over PCIe: master, m and v stream through HBM slots on the copy engines.

A kernel that reads pinned host memory directly (zero copy) moves small transactions over PCIe
and reaches a fraction of the link; on a coherent link (c2c, GH200) it is the right way. Over
PCIe, ghtier's C++ optimizer copies each chunk of state into one of three HBM slots (host -> slot
on one stream), updates the slot on the compute stream, and copies it back (slot -> host on a
third stream), so both link directions and the kernel run at once (optimizer/adamw_link.cpp). This
is that pipeline for ghtier.torch.AdamW, on torch streams and events.

Ordering: a slot is refilled only after its previous chunk went back to the host (event per
slot); the first upload of a step waits for the last download of the step before (the host state
it reads must be the newest); the compute stream waits for each chunk's upload before its kernel,
and the download waits for the kernel. Weights: bf16 parameters are written by the kernel in
place; an fp32 parameter gets its chunk of the new master from the slot (a device-to-device copy
on the compute stream), so the next forward never waits for the link.
"""
from typing import Any, List, Optional, Tuple

import torch

SLOTS = 3
# Parameters per chunk: 16Mi parameters (192 MiB of fp32 state per slot): large enough that a copy
# runs at the link's rate, small enough that the pipeline fills quickly. A multiple of the q8 block.
CHUNK = 1 << 24


def _bytes(t: torch.Tensor) -> torch.Tensor:
    """A contiguous tensor as its flat bytes."""
    return t.reshape(-1).view(torch.uint8)


class LinkStager:
    def __init__(self, core: Any, device: torch.device, state_type: str, chunk: int = CHUNK):
        if chunk % 256:
            raise ValueError(f"LinkStager: chunk {chunk} is not a multiple of the q8 block (256)")
        self.core, self.device, self.state_type, self.chunk = core, device, state_type, chunk
        self.up = torch.cuda.Stream(device)
        self.down = torch.cuda.Stream(device)
        self.slots: List[Optional[torch.Tensor]] = [None] * SLOTS
        self.free: List[Optional[torch.cuda.Event]] = [None] * SLOTS
        self.next_slot = 0

    def _slot(self, i: int, n: int) -> Tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Slot i's master (fp32), m and v bytes for a chunk of n parameters."""
        sm = self.core.state_bytes(self.state_type, self.chunk)
        if self.slots[i] is None:
            # 16-byte aligned parts, so the kernel takes its vector path.
            stride = (4 * self.chunk + 2 * sm + 15) // 16 * 16
            self.slots[i] = torch.empty(stride, dtype=torch.uint8, device=self.device)
        buf = self.slots[i]
        nm = self.core.state_bytes(self.state_type, n)
        return (buf[: 4 * n].view(torch.float32), buf[4 * self.chunk: 4 * self.chunk + nm],
                buf[4 * self.chunk + sm: 4 * self.chunk + sm + nm])

    def begin_step(self) -> None:
        """The uploads of this step read host state that the last step's downloads wrote."""
        done = torch.cuda.Event()
        done.record(self.down)
        self.up.wait_event(done)

    def update(self, p: torch.Tensor, master: torch.Tensor, m: torch.Tensor, v: torch.Tensor,
               g: torch.Tensor, kind: str, hyper: tuple, compute: torch.cuda.Stream) -> None:
        n = p.numel()
        master_f = master.reshape(-1)
        m_b, v_b = _bytes(m), _bytes(v)
        p_flat = p.detach().reshape(-1)
        g_flat = g.reshape(-1)
        for a in range(0, n, self.chunk):
            cnt = min(self.chunk, n - a)
            i = self.next_slot
            self.next_slot = (i + 1) % SLOTS
            if self.free[i] is not None:
                self.up.wait_event(self.free[i])
            s_master, s_m, s_v = self._slot(i, cnt)
            off = self.core.state_bytes(self.state_type, a)  # a is a whole number of q8 blocks
            nb = s_m.numel()
            with torch.cuda.stream(self.up):
                s_master.copy_(master_f[a: a + cnt], non_blocking=True)
                s_m.copy_(m_b[off: off + nb], non_blocking=True)
                s_v.copy_(v_b[off: off + nb], non_blocking=True)
            compute.wait_stream(self.up)
            writes_weight = p.dtype == torch.bfloat16
            self.core.adamw_gpu(s_master.data_ptr(), s_m.data_ptr(), s_v.data_ptr(),
                                g_flat[a:].data_ptr(), kind,
                                p_flat[a:].data_ptr() if writes_weight else 0, cnt, self.state_type,
                                *hyper, compute.cuda_stream, a)
            if not writes_weight:
                with torch.cuda.stream(compute):
                    p_flat[a: a + cnt].copy_(s_master, non_blocking=True)
            self.down.wait_stream(compute)
            with torch.cuda.stream(self.down):
                master_f[a: a + cnt].copy_(s_master, non_blocking=True)
                m_b[off: off + nb].copy_(s_m, non_blocking=True)
                v_b[off: off + nb].copy_(s_v, non_blocking=True)
            ev = torch.cuda.Event()
            ev.record(self.down)
            self.free[i] = ev
