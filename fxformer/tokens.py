"""Special token ids, shared by the tokenizer, the model and the decoders.

pad never doubles as unk: sentencepiece is trained with exactly these ids.
"""

PAD_ID = 0
UNK_ID = 1
BOS_ID = 2
EOS_ID = 3


def text_ids(ids) -> list[int]:
    """The ids a decoder turns into text: those before the first EOS, less pad and bos."""
    out = []
    for i in ids:
        i = int(i)
        if i == EOS_ID:
            break
        if i not in (PAD_ID, BOS_ID):
            out.append(i)
    return out
