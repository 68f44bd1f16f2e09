"""Special token ids, shared by the tokenizer, the model and the decoders.

pad never doubles as unk: sentencepiece is trained with exactly these ids.
"""

PAD_ID = 0
UNK_ID = 1
BOS_ID = 2
EOS_ID = 3
