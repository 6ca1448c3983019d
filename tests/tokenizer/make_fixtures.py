#!/usr/bin/env python3
"""Writes the committed tokenizer fixtures of tests/tokenizer/data/fixtures/ with Hugging Face `tokenizers`.

The files are the Qwen2 and SentencePiece (Llama 2 / Mistral / Gemma) styles of tokenizer.json, built with
the same normalizer, pre_tokenizer, model flags and decoder as transformers' Qwen2Tokenizer, LlamaTokenizer
and GemmaTokenizer (and LlamaConverter's older legacy form), with a small vocabulary trained here on
generated multi-script text; plus, for every tokenizer T and text X of tests/tokenizer/data/, the ids
tokenizers gives (T__X.ids, uint32 little-endian, add_special_tokens=False) and its decode of them
(T__X.decoded, skip_special_tokens=False, UTF-8). tests/tokenizer/test_tokenizer_fixtures.c reads them without
a venv; tests/tokenizer/test_tokenizer_ref.c regenerates them at test time when the venv is there.

  make_fixtures.py OUTDIR [TEXT ...]      (default: tests/tokenizer/data/fixtures and the texts named below)

Nothing is downloaded. Run it from the repository root with the venv's python after changing a style or
a text, and commit what it writes.
"""
import collections
import json
import os
import struct
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import tokenizer_ref  # noqa: E402  (the multi-script text generator)

QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                 r"|\s*[\r\n]+|\s+(?!\S)|\s+")
HERE = os.path.dirname(os.path.abspath(__file__))
TEXTS = [os.path.join(HERE, 'data', name) for name in ('mixed.txt', 'edges.txt', 'special_start.txt')]


def corpus(path):
    """Generated text only (seeded), so the fixtures change only when this script does."""
    text = tokenizer_ref.multiscript(150000, 5)
    with open(path, 'w', encoding='utf-8') as f:
        f.write(text)


def qwen2(corpus_path, vocab=900):
    from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(dropout=None, unk_token=None, continuing_subword_prefix='', end_of_word_suffix='',
                               fuse_unk=False, byte_fallback=False))
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior='isolated', invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=['<|endoftext|>', '<|im_start|>', '<|im_end|>'],
                                  show_progress=False, initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train([corpus_path], trainer)
    return json.loads(tok.to_str())


def sentencepiece(corpus_path, vocab=900, limit_alphabet=250):
    """Llama 2 as transformers 5 builds it: Metaspace (first, split false), BPE with byte_fallback and
    fuse_unk, <unk> <s> </s> then the 256 <0xXX> tokens, decoder Replace/ByteFallback/Fuse/Strip."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    tok = Tokenizer(models.BPE(unk_token='<unk>', fuse_unk=True, byte_fallback=True, dropout=None))
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement='▁', prepend_scheme='first', split=True)
    # the most frequent characters, ties by code point: the trainer's own limit_alphabet breaks ties in hash
    # order, which would make the fixtures differ run to run; the rest go through byte_fallback
    with open(corpus_path, encoding='utf-8') as f:
        counts = collections.Counter(f.read().replace(' ', '▁'))
    alphabet = sorted(sorted(counts), key=lambda c: -counts[c])[:limit_alphabet]
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=['<unk>', '<s>', '</s>'], show_progress=False,
                                  initial_alphabet=alphabet, limit_alphabet=len(alphabet))
    tok.train([corpus_path], trainer)
    j = json.loads(tok.to_str())
    # SentencePiece's layout: the three specials, the byte tokens, then the pieces
    old = sorted(j['model']['vocab'].items(), key=lambda kv: kv[1])
    vocab = {}
    for k, _ in old[:3]:
        vocab[k] = len(vocab)
    for b in range(256):
        vocab['<0x%02X>' % b] = len(vocab)
    for k, _ in old[3:]:
        vocab[k] = len(vocab)
    j['model']['vocab'] = vocab
    for a in j['added_tokens']:
        a['id'] = vocab[a['content']]
    j['pre_tokenizer']['split'] = False
    j['decoder'] = {'type': 'Sequence', 'decoders': [
        {'type': 'Replace', 'pattern': {'String': '▁'}, 'content': ' '}, {'type': 'ByteFallback'},
        {'type': 'Fuse'}, {'type': 'Strip', 'content': ' ', 'start': 1, 'stop': 0}]}
    return j


def variants(spm):
    """The other SentencePiece spellings, on the same vocabulary."""
    out = {}
    v = json.loads(json.dumps(spm))
    v['pre_tokenizer']['split'] = True
    out['spm_split'] = v
    v = json.loads(json.dumps(spm))
    v['pre_tokenizer']['prepend_scheme'] = 'always'
    v['pre_tokenizer']['split'] = True
    v['decoder'] = {'type': 'Metaspace', 'replacement': '▁', 'prepend_scheme': 'always', 'split': True}
    out['spm_always_metaspace_decoder'] = v
    # LlamaConverter's legacy form: the normalizer does the work, no pre-tokenizer
    v = json.loads(json.dumps(spm))
    v['normalizer'] = {'type': 'Sequence', 'normalizers': [{'type': 'Prepend', 'prepend': '▁'},
                                                           {'type': 'Replace', 'pattern': {'String': ' '},
                                                            'content': '▁'}]}
    v['pre_tokenizer'] = None
    out['spm_legacy'] = v
    # GemmaTokenizer: Replace only, a Split on " " that finds none, no Strip
    v = json.loads(json.dumps(spm))
    v['normalizer'] = {'type': 'Replace', 'pattern': {'String': ' '}, 'content': '▁'}
    v['pre_tokenizer'] = {'type': 'Split', 'pattern': {'String': ' '}, 'behavior': 'MergedWithPrevious',
                          'invert': False}
    v['decoder']['decoders'] = v['decoder']['decoders'][:3]
    out['spm_gemma'] = v
    v = json.loads(json.dumps(spm))
    v['normalizer'] = {'type': 'NFKC'}
    out['spm_nfkc'] = v
    # without byte_fallback a character outside the vocabulary is <unk>, a run of them one <unk> (fuse_unk)
    v = json.loads(json.dumps(spm))
    v['model']['byte_fallback'] = False
    out['spm_unk_fused'] = v
    v = json.loads(json.dumps(v))
    v['model']['fuse_unk'] = False
    out['spm_unk'] = v
    return out


def encode_all(outdir, names, texts):
    from tokenizers import Tokenizer
    for name in names:
        tok = Tokenizer.from_file(os.path.join(outdir, name + '.json'))
        for tpath in texts:
            with open(tpath, 'rb') as f:
                text = f.read().decode('utf-8')
            ids = tok.encode(text, add_special_tokens=False).ids
            base = os.path.join(outdir, name + '__' + os.path.splitext(os.path.basename(tpath))[0])
            with open(base + '.ids', 'wb') as f:
                f.write(struct.pack('<%dI' % len(ids), *ids))
            with open(base + '.decoded', 'wb') as f:
                f.write(tok.decode(ids, skip_special_tokens=False).encode('utf-8'))


def build(outdir, texts):
    """Every tokenizer and its ids and decode of each text into outdir; returns the tokenizer names."""
    os.makedirs(outdir, exist_ok=True)
    cpath = os.path.join(outdir, 'corpus.tmp')
    corpus(cpath)
    toks = {'qwen2': qwen2(cpath), 'spm': sentencepiece(cpath)}
    os.unlink(cpath)
    toks['qwen2_nfkc'] = json.loads(json.dumps(toks['qwen2']))
    toks['qwen2_nfkc']['normalizer'] = {'type': 'Sequence', 'normalizers': [{'type': 'NFKC'}]}
    toks.update(variants(toks['spm']))
    for name, j in toks.items():
        with open(os.path.join(outdir, name + '.json'), 'w', encoding='utf-8') as f:
            json.dump(j, f, ensure_ascii=False, separators=(',', ':'))
    encode_all(outdir, sorted(toks), texts)
    return sorted(toks)


def main():
    outdir = sys.argv[1] if len(sys.argv) > 1 else os.path.join(HERE, 'data', 'fixtures')
    print(' '.join(build(outdir, sys.argv[2:] or TEXTS)))


if __name__ == '__main__':
    main()
