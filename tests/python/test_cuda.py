"""The CUDA paths: stream handshakes with torch's streams (the legacy default stream included), slot reuse
only after the consumer's event, and the caching allocator. Run on a GPU with FERRY_TEST_BACKENDS=cuda."""
import pytest
import torch

from ferry.torch import ChecksumSink, Egress, Prefetcher
from conftest import cuda_only


def test_egress_copies_after_the_producers_side_stream(backend):
    cuda_only(backend)
    sink = ChecksumSink()
    side = torch.cuda.Stream()
    expected = []
    with Egress(sink, slots=2, slot_bytes=1 << 20, device=0) as e:
        for i in range(6):
            with torch.cuda.stream(side):
                torch.cuda._sleep(2_000_000)  # the output is written late on the side stream
                out = torch.full((1 << 18,), float(i), device="cuda")
                out.mul_(3)
            e.submit(out, stream=side, tag=i)
            expected.append(ChecksumSink.of(torch.full((1 << 18,), 3.0 * i).numpy().tobytes()))
            del out  # the Egress holds it until the copy is done
        e.flush()
        assert [sink.checksum(i) for i in range(6)] == expected


def test_egress_on_the_legacy_default_stream_and_event_wait(backend):
    cuda_only(backend)
    assert torch.cuda.current_stream().cuda_stream == 0
    sink = ChecksumSink()
    with Egress(sink, slots=2, slot_bytes=1 << 16, device=0) as e:
        buf = torch.empty(1 << 16, device="cuda")
        for i in range(5):
            torch.cuda._sleep(1_000_000)
            buf.fill_(float(i))  # the same buffer, rewritten: wait for the copy out of it first
            ev = e.submit(buf, tag=i)
            ev.wait()  # the current (legacy default) stream waits on the device
        e.flush()
        for i in range(5):
            assert sink.checksum(i) == ChecksumSink.of(torch.full((1 << 16,), float(i)).numpy().tobytes())


def test_egress_refuses_a_stream_of_another_device(backend):
    cuda_only(backend)

    class Elsewhere:
        device = torch.device("cuda", 7)

        def __cuda_stream__(self):
            return (0, 12345)

    with Egress(ChecksumSink(), slots=1, slot_bytes=1024, device=0) as e:
        with pytest.raises(ValueError, match="cuda:7"):
            e.submit(torch.zeros(4, device="cuda"), stream=Elsewhere())
        with pytest.raises(ValueError, match="is on cpu"):
            e.submit(torch.zeros(4))


def test_prefetched_slots_are_reused_only_after_the_consumers_work(backend):
    cuda_only(backend)
    src = [torch.full((1 << 20,), float(k)) for k in range(12)]
    sums = []
    for x in Prefetcher(src, depth=2, device=0):
        torch.cuda._sleep(5_000_000)  # slow consumer: the slot must not be refilled under this read
        sums.append(x.sum())
    torch.cuda.synchronize()
    assert [s.item() for s in sums] == [float(k * (1 << 20)) for k in range(12)]


def test_prefetched_batches_are_ready_on_a_side_stream_too(backend):
    cuda_only(backend)
    src = [(torch.arange(1000, dtype=torch.float32) + k,) for k in range(6)]
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        got = [x.sum() for (x,) in Prefetcher(src, device=0)]
    side.synchronize()
    assert [g.item() for g in got] == [float(sum(range(1000)) + 1000 * k) for k in range(6)]
