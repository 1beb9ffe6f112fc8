"""A second real architecture: Gemma 3 270M (base model, no chat template of its own), run with
``model.chat_template=gemma``. The HF engine's behaviour log-probs match the learner's forward
(``forward_response``, the learner's own scoring) on sampled chat turns, and the template's
end-of-turn token stops generation."""

import pytest
import torch

from actors.engines.hf import HFEngine
from pipeline.algorithm.logprobs import response_logprobs
from pipeline.models import GEMMA3_N_PARAMS, has_chat_template, load_tokenizer
from pipeline.tools.cli import compose

pytestmark = [pytest.mark.slow, pytest.mark.integration]

PARITY_ATOL_FP32 = 1e-4


@pytest.fixture(scope="module")
def engine(gemma3_model_dir):
    return HFEngine.from_pretrained(gemma3_model_dir, dtype="fp32", chat_template="gemma")


@pytest.mark.extended
def test_gemma3_is_a_base_model_that_needs_a_template(gemma3_model_dir):
    import json

    info = json.loads((gemma3_model_dir / "privy_model.json").read_text())
    assert info["n_params"] == GEMMA3_N_PARAMS
    assert not has_chat_template(load_tokenizer(gemma3_model_dir))
    assert compose(["model=gemma3_270m"]).model.chat_template == "gemma"


def test_gemma3_engine_logprobs_match_the_learner_forward(engine):
    tok = engine.tokenizer
    assert type(engine.model).__name__ == "Gemma3ForCausalLM"
    prompts = [
        list(
            tok.apply_chat_template(
                [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True, return_dict=False
            )
        )
        for q in ("Name a colour.", "Count to three, please.")
    ]
    assert tok.convert_ids_to_tokens(prompts[0][:2]) == ["<bos>", "<start_of_turn>"]
    for temperature, seed in ((1.0, 0), (0.7, 1)):
        gens = engine.generate(prompts, max_new_tokens=12, temperature=temperature, seed=seed)
        ref = response_logprobs(engine.model, prompts, [g.token_ids for g in gens], temperature=temperature)
        gap = max((r - torch.tensor(g.logprobs)).abs().max().item() for r, g in zip(ref, gens))
        assert gap < PARITY_ATOL_FP32, gap


def test_the_gemma_templates_end_of_turn_token_stops_generation(engine):
    end = engine.tokenizer.convert_tokens_to_ids("<end_of_turn>")
    assert end in engine._eos_ids and engine.tokenizer.eos_token_id in engine._eos_ids
