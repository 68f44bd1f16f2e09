"""transformers' side of the interop tests (test_marian.py, test_export.py): its log-probabilities
and its searches, computed by transformers itself. Import it after `pytest.importorskip("torch")`."""

import numpy as np
import torch


def their_token_log_probs(model, source_ids: list[int], target_ids: list[int]) -> np.ndarray:
    """transformers' log-probability of each of its ids `target_ids` (ending in </s>) given
    `source_ids`, teacher-forced."""
    labels = torch.tensor([target_ids])
    with torch.no_grad():
        logits = model(input_ids=torch.tensor([source_ids]), labels=labels).logits[0]
    return torch.log_softmax(logits.double(), -1).gather(-1, labels[0][:, None])[:, 0].numpy()


def their_log_probs(model, tokenizer, source: str, target: str) -> np.ndarray:
    """transformers' log-probability of each token of `target` given `source`, both tokenized by
    transformers' tokenizer."""
    enc = tokenizer(source, text_target=target)
    return their_token_log_probs(model, enc["input_ids"], enc["labels"])


def their_search(model, source_ids: list[int], max_extra: int, barred: list[int], **search) -> list[int]:
    """transformers' `generate` on one source, limited as fxformer limits a search (the source's
    tokens + `max_extra`), no forced end, the ids fxformer never emits (`barred`) barred; greedy
    unless `search` says otherwise (num_beams, length_penalty). Its ids, the decoder's start first."""
    with torch.no_grad():
        out = model.generate(
            torch.tensor([source_ids]),
            **{"num_beams": 1, **search},
            do_sample=False,
            max_new_tokens=len(source_ids) + max_extra,
            forced_eos_token_id=None,
            bad_words_ids=[[i] for i in barred],
        )
    return out[0].tolist()


def their_greedy(model, tokenizer, source: str, max_extra: int, barred: list[int]) -> str:
    """transformers' greedy translation of `source`, as text (`their_search`)."""
    ids = tokenizer(source)["input_ids"]
    return tokenizer.decode(their_search(model, ids, max_extra, barred), skip_special_tokens=True)
