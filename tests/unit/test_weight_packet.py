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


@pytest.fixture(scope="module")
def tiny_dir(tmp_path_factory):
    from pipeline.models import build_tiny_model

    return build_tiny_model(tmp_path_factory.mktemp("tiny") / "m", seed=0, vocab="bytes")


def _tied_model(path):
    from pipeline.models import load_model

    return load_model(path, "float32")


def test_a_tied_lm_head_leaves_the_learner_once_and_every_receiver_loads_it(tiny_dir):
    from pipeline.distributed.weight_sync import load_into, without_aliases

    model = _tied_model(tiny_dir)
    sd = model.state_dict()
    assert sd["lm_head.weight"].data_ptr() == sd["model.embed_tokens.weight"].data_ptr()
    sent = without_aliases(sd)
    # the first name of each storage stays, its alias goes: the embedding is sent once
    assert "model.embed_tokens.weight" in sent and "lm_head.weight" not in sent
    assert len({t.data_ptr() for t in sent.values()}) == len(sent)
    buffers = []
    pickle.dumps(pack({k: v.clone() for k, v in sent.items()}, 1), protocol=5, buffer_callback=buffers.append)
    assert len(buffers) == len(sd) - 1

    other = _tied_model(tiny_dir)
    new = {k: v + 1.0 for k, v in sent.items()}
    load_into(other, new)
    got = other.state_dict()
    for k, v in new.items():
        assert torch.equal(got[k], v)
    # still tied, and the head holds the sent embedding
    assert got["lm_head.weight"].data_ptr() == got["model.embed_tokens.weight"].data_ptr()
    assert torch.equal(got["lm_head.weight"], new["model.embed_tokens.weight"])


def test_loading_refuses_a_missing_tensor_and_an_unknown_name(tiny_dir):
    from pipeline.distributed.weight_sync import load_into, without_aliases

    model = _tied_model(tiny_dir)
    sd = without_aliases(model.state_dict())
    short = dict(sd)
    short.pop("model.norm.weight")
    with pytest.raises(KeyError, match="model.norm.weight"):
        load_into(model, short)
    with pytest.raises(KeyError, match="nonsense"):
        load_into(model, {**sd, "nonsense": torch.zeros(1)})
    bad = {**sd, "model.norm.weight": torch.zeros(3)}
    with pytest.raises(ValueError, match="model.norm.weight"):
        load_into(model, bad)
