"""WeightPacket through pickle protocol 5, the way Ray's object store moves it."""

import pickle

import pytest
import torch

from pipeline.distributed.weight_sync import WeightSyncError, pack, verify


def _state_dict():
    g = torch.Generator().manual_seed(0)
    return {
        "embed": torch.randn(512, 64, generator=g).to(torch.bfloat16),
        "proj": torch.randn(64, 64, generator=g).t(),  # not contiguous
        "norm": torch.randn(8, generator=g),
        "steps": torch.tensor([3], dtype=torch.int64),
    }


def test_a_packet_round_trips_bit_exactly_with_its_tensors_out_of_band():
    sd = _state_dict()
    packet = pack(sd, 7)
    buffers = []
    data = pickle.dumps(packet, protocol=5, buffer_callback=buffers.append)
    # every tensor leaves the pickle stream as a raw buffer (Ray maps those without copying)
    assert len(buffers) == len(sd)
    assert len(data) < 0.2 * sum(t.numel() * t.element_size() for t in sd.values())
    back = pickle.loads(data, buffers=buffers)
    verify(back)
    assert back.version == 7 and set(back.state_dict) == set(sd)
    for k, t in sd.items():
        got = back.state_dict[k]
        assert got.dtype == t.dtype and got.shape == t.shape and torch.equal(got, t)


def test_a_corrupted_buffer_is_caught_by_the_checksum():
    packet = pack(_state_dict(), 1)
    buffers = []
    data = pickle.dumps(packet, protocol=5, buffer_callback=buffers.append)
    raw = [bytearray(b.raw()) for b in buffers]
    raw[0][5] ^= 0xFF  # one flipped byte in the embedding
    back = pickle.loads(data, buffers=raw)
    with pytest.raises(WeightSyncError, match="checksum"):
        verify(back)
