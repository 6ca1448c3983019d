#!/usr/bin/env python3
"""The peer of fsdpc's tokenizer: Hugging Face `tokenizers` (PyPI), run from the venv the tests find.

Subcommands (all paths are files; nothing is downloaded):
  corpus OUT --bytes N [--seed S] [--src DIR ...] [--multiscript F] [--skip B]
      Text to train and test on: this repository's docs and sources (--src), Python's own standard
      library (its first B bytes skipped), and a share F (default 0.5) of generated multi-script text
      (Latin with accents, Cyrillic, Greek, Arabic, Hebrew, Devanagari, CJK, Hangul, Thai, kana, emoji
      with ZWJ and skin tones, combining marks, digits, whitespace runs, CRLF), cut to N bytes at a
      character boundary.
  multiscript OUT --bytes N [--seed S]
      Only the generated multi-script text.
  train --style gpt2|llama3|qwen2|spm --vocab N --out TOKENIZER.json [--special TOK ...] FILE...
      Trains a BPE: gpt2 = ByteLevel pre-tokenizer with its regex; llama3 = Split with the Llama 3
      pattern, then ByteLevel without regex, ignore_merges on; qwen2 and spm = make_fixtures.py's Qwen2
      and Llama 2 (Metaspace, split false, byte_fallback) styles (one FILE; --special ignored).
  variants TOKENIZER.json OUTDIR
      Writes tokenizer.json variants that exercise the rest of the format (Split behaviours, invert,
      String patterns, add_prefix_space, added tokens with lstrip/rstrip/single_word/normalized,
      "a b" merges, unk/byte_fallback); prints their names.
  encode --out-dir DIR --text TEXT [--text TEXT ...] TOKENIZER.json...
      For every tokenizer T and text X: DIR/T__X.ids, the ids of X (read as bytes, decoded as strict
      UTF-8; add_special_tokens=False) as uint32 little-endian, and DIR/T__X.roundtrip, "1" when
      decode(ids, skip_special_tokens=False) gives X's bytes back, else "0" (T and X without their folder
      and extension).
  autotokenizer DIR TEXT IDS
      transformers' AutoTokenizer.from_pretrained(DIR) encodes TEXT to exactly the uint32 ids in IDS.
  adversarial OUTDIR --seed S --count N TOKENIZER.json...
      N short texts drawn from the characters where tokenizers go wrong (combining marks, ▁ and its runs,
      special-token strings, space kinds, CRLF, NUL, Hangul jamo, compatibility characters, ZWJ, digits),
      written to OUTDIR/texts.bin (u32 length + UTF-8 each), and for each tokenizer T OUTDIR/T.adv: per
      text, u32 n + n uint32 ids (add_special_tokens=False), then u32 length + the UTF-8 of decode(ids,
      skip_special_tokens=False).
  fixtures OUTDIR TEXT...
      The Qwen2 and SentencePiece style tokenizers of make_fixtures.py, trained afresh, with their ids
      (T__X.ids) and decode (T__X.decoded) of each text; prints the tokenizer names.
  bench TOKENIZER.json TEXT IDS [--repeat R]
      One thread (RAYON_NUM_THREADS=1): prints `mb_s=X method=M`, the fastest of encode() of the whole
      text and encode_batch_fast() of its paragraphs, and writes encode()'s ids to IDS (uint32).
"""
import argparse
import json
import os
import random
import struct
import sys
import sysconfig
import time

LLAMA3_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*"
                  r"|\s*[\r\n]+|\s+(?!\S)|\s+")


def _chars(a, b):
    return [chr(c) for c in range(a, b + 1)]


SCRIPTS = {
    'latin': (list('bcdfghjklmnprstvwz') + ['ch', 'sh', 'th', 'ß', 'ç', 'ñ', 'ł'],
              list('aeiou') + list('éèêëàâäîïôöûüùåøæœ') + ['ou', 'ai']),
    'cyrillic': (list('бвгджзклмнпрстфхцчшщ'), list('аеёиоуыэюя')),
    'greek': (list('βγδζθκλμνξπρστφχψ'), list('αεηιουωάέήίόύώ')),
    'arabic': (list('بتثجحخدذرزسشصضطظعغفقكلمنهوي'), ['َ', 'ِ', 'ُ', 'ا', 'ي', 'و', '']),
    'hebrew': (list('בגדהוזחטכלמנסעפצקרשת'), ['', 'א', 'י', 'ו']),
    'devanagari': (list('कखगघचछजझटठडढतथदधनपफबभमयरलवशषसह'),
                   ['', 'ा', 'ि', 'ी', 'ु', 'ू', 'े', 'ै', 'ो', 'ौ', 'ं', '्']),
    'hangul': (_chars(0xAC00, 0xAC00 + 600), ['']),
    'thai': (list('กขคงจฉชซญดตถทนบปผพฟมยรลวศสหอฮ'), ['', 'า', 'ิ', 'ี', 'ุ', 'ู', 'เ', 'แ', '่', '้']),
    'kana': (_chars(0x3041, 0x3093) + _chars(0x30A1, 0x30F3), ['']),
}
CJK = _chars(0x4E00, 0x4E00 + 2500)
EMOJI = ['😀', '😂', '🥲', '👍', '🚀', '🎉', '🔥', '❤️', '🌍', '🍕', '🐍', '🧠', '👩\u200d💻', '👨\u200d👩\u200d👧\u200d👦',
         '🏳️\u200d🌈', '🧑🏿\u200d🚀', '👍🏽', '🇫🇷', '🇯🇵', '❤️\u200d🔥', '✍🏻']
COMBINING = ['\u0301', '\u0300', '\u0308', '\u0303', '\u0327', '\u0323', '\u0304', '\u030c']
PUNCT = ['.', ',', ';', ':', '!', '?', '...', ' -', ' —', '(', ')', '"', "'", '«', '»', '、', '。', '،', '।', '?!']
SPACES = [' ', ' ', ' ', ' ', '  ', '   ', '\t', ' \u00a0', '\u3000', '\u2003']
BREAKS = ['\n', '\r\n', '\n\n', '\r\n\r\n', ' \n', '\n   ']


def _word(rng, script):
    if script == 'cjk':
        return ''.join(rng.choice(CJK) for _ in range(rng.randint(1, 4)))
    cons, vows = SCRIPTS[script]
    w = ''.join(rng.choice(cons) + rng.choice(vows) for _ in range(rng.randint(1, 4)))
    if script == 'latin' and rng.random() < 0.1:
        w = w[:1] + rng.choice(COMBINING) + w[1:]
    if script == 'latin' and rng.random() < 0.15:
        w = w.capitalize()
    return w


def multiscript(n_bytes, seed):
    """Zipf-distributed words per script, so a BPE trainer finds merges in every script."""
    rng = random.Random(seed)
    names = list(SCRIPTS) + ['cjk']
    lex = {s: [_word(rng, s) for _ in range(3000)] for s in names}
    weights = [1.0 / (i + 1) for i in range(3000)]
    out, size = [], 0
    while size < n_bytes:
        script = rng.choice(names)
        para = []
        for _ in range(rng.randint(5, 40)):
            r = rng.random()
            if r < 0.05:
                tok = rng.choice(EMOJI)
            elif r < 0.10:
                tok = str(rng.choice([rng.randint(0, 9), rng.randint(10, 999), rng.randint(1000, 10 ** 9)]))
            elif r < 0.13:
                tok = rng.choice(PUNCT)
            elif r < 0.16:
                tok = "'" + rng.choice(['s', 't', 're', 'll', 'S', 'D', 've'])
            else:
                tok = rng.choices(lex[script], weights)[0]
            para.append(tok)
            para.append('' if script in ('cjk', 'thai', 'kana') and rng.random() < 0.7 else rng.choice(SPACES))
        text = ''.join(para) + rng.choice(BREAKS)
        out.append(text)
        size += len(text.encode())
    return ''.join(out)


def local_text(src_dirs, limit, skip=0):
    """Repository text and Python's standard library, in sorted order, without its first `skip` bytes."""
    roots = list(src_dirs) + [sysconfig.get_paths()['stdlib']]
    parts, size = [], -skip
    for root in roots:
        for dirpath, dirnames, filenames in os.walk(root):
            dirnames[:] = sorted(d for d in dirnames if not d.startswith('.') and d not in ('site-packages', 'test',
                                                                                                'build'))
            for name in sorted(filenames):
                if not name.endswith(('.py', '.c', '.h', '.md', '.txt', '.ini', '.sh', '.build')):
                    continue
                try:
                    with open(os.path.join(dirpath, name), 'rb') as f:
                        data = f.read().decode('utf-8')
                except (OSError, UnicodeDecodeError):
                    continue
                n = len(data.encode())
                if size + n <= 0:
                    size += n
                    continue
                parts.append(data)
                size += n
                if size >= limit:
                    return ''.join(parts)
    return ''.join(parts)


def cut(text, n_bytes):
    return text.encode()[:n_bytes].decode('utf-8', errors='ignore')


def cmd_corpus(a):
    local = int(a.bytes * (1 - a.multiscript))
    text = cut(local_text(a.src, local, a.skip), local) + multiscript(a.bytes - local, a.seed)
    with open(a.out, 'wb') as f:
        f.write(cut(text, a.bytes).encode())


def cmd_multiscript(a):
    with open(a.out, 'wb') as f:
        f.write(cut(multiscript(a.bytes, a.seed), a.bytes).encode())


def cmd_train(a):
    from tokenizers import Tokenizer, Regex, decoders, models, pre_tokenizers, trainers
    if a.style in ('qwen2', 'spm'):
        import make_fixtures
        j = make_fixtures.qwen2(a.files[0], a.vocab) if a.style == 'qwen2' else \
            make_fixtures.sentencepiece(a.files[0], a.vocab - 256, 1000)
        with open(a.out, 'w', encoding='utf-8') as f:
            json.dump(j, f, ensure_ascii=False)
        return
    if a.style == 'gpt2':
        tok = Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    else:
        tok = Tokenizer(models.BPE(ignore_merges=True))
        tok.pre_tokenizer = pre_tokenizers.Sequence([
            pre_tokenizers.Split(Regex(LLAMA3_PATTERN), behavior='isolated', invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tok.decoder = decoders.ByteLevel()
    specials = a.special or (['<|endoftext|>'] if a.style == 'gpt2' else ['<|begin_of_text|>', '<|end_of_text|>'])
    trainer = trainers.BpeTrainer(vocab_size=a.vocab, special_tokens=specials, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train(a.files, trainer)
    tok.save(a.out)


def _save(obj, outdir, name, names):
    with open(os.path.join(outdir, name + '.json'), 'w', encoding='utf-8') as f:
        json.dump(obj, f, ensure_ascii=False)
    names.append(name)


def cmd_variants(a):
    """tokenizer.json edits covering what a trained file does not: each is checked against tokenizers."""
    from tokenizers import AddedToken, Tokenizer
    with open(a.tokenizer, encoding='utf-8') as f:
        base = json.load(f)
    os.makedirs(a.outdir, exist_ok=True)
    names = []
    pre = base['pre_tokenizer']
    split = pre['pretokenizers'][0] if pre['type'] == 'Sequence' else None
    if split:
        for beh in ['Removed', 'MergedWithPrevious', 'MergedWithNext', 'Contiguous']:
            v = json.loads(json.dumps(base))
            v['pre_tokenizer']['pretokenizers'][0]['behavior'] = beh
            _save(v, a.outdir, 'split_' + beh, names)
        v = json.loads(json.dumps(base))
        v['pre_tokenizer']['pretokenizers'][0]['invert'] = True
        v['pre_tokenizer']['pretokenizers'][0]['behavior'] = 'Removed'
        _save(v, a.outdir, 'split_invert', names)
        v = json.loads(json.dumps(base))
        v['pre_tokenizer']['pretokenizers'].insert(0, {'type': 'Split', 'pattern': {'String': ', '},
                                                       'behavior': 'MergedWithNext', 'invert': False})
        _save(v, a.outdir, 'split_string', names)
        v = json.loads(json.dumps(base))
        v['pre_tokenizer']['pretokenizers'].insert(0, {'type': 'Split', 'pattern': {'Regex': r'x*'},
                                                       'behavior': 'Isolated', 'invert': False})
        _save(v, a.outdir, 'split_empty_matches', names)
        v = json.loads(json.dumps(base))
        v['pre_tokenizer']['pretokenizers'][-1]['add_prefix_space'] = True
        _save(v, a.outdir, 'prefix_space', names)
        v = json.loads(json.dumps(base))
        v['model']['ignore_merges'] = False
        _save(v, a.outdir, 'no_ignore_merges', names)
    else:
        v = json.loads(json.dumps(base))
        v['pre_tokenizer']['add_prefix_space'] = True
        _save(v, a.outdir, 'prefix_space', names)
        v = json.loads(json.dumps(base))
        v['pre_tokenizer'] = {'type': 'Sequence', 'pretokenizers': [
            {'type': 'Split', 'pattern': {'Regex': r'\s+'}, 'behavior': 'Contiguous', 'invert': True},
            v['pre_tokenizer']]}
        _save(v, a.outdir, 'split_then_bytelevel_regex', names)
        v = json.loads(json.dumps(base))
        v['model']['ignore_merges'] = True
        _save(v, a.outdir, 'ignore_merges', names)
    v = json.loads(json.dumps(base))
    v['model']['merges'] = [' '.join(m) if isinstance(m, list) else m for m in v['model']['merges']]
    _save(v, a.outdir, 'merges_strings', names)
    # a vocabulary without some byte characters: dropped without unk, <unk> with it, <0xXX> with fallback
    v = json.loads(json.dumps(base))
    drop = {k for k in v['model']['vocab'] if k in ('é', 'Ã', '¤', 'ä', 'Ð', 'à')}
    keep = {k: i for k, i in v['model']['vocab'].items() if k not in drop and not any(d in k for d in drop)}
    v['model']['merges'] = [m for m in v['model']['merges']
                            if all(p in keep for p in (m if isinstance(m, list) else m.split(' ')))
                            and ''.join(m if isinstance(m, list) else m.split(' ')) in keep]
    v['model']['vocab'] = keep
    _save(v, a.outdir, 'missing_bytes', names)
    v2 = json.loads(json.dumps(v))
    nid = max(keep.values()) + 1
    v2['model']['vocab']['<unk>'] = nid
    v2['model']['unk_token'] = '<unk>'
    _save(v2, a.outdir, 'missing_bytes_unk', names)
    v3 = json.loads(json.dumps(v2))
    v3['model']['fuse_unk'] = True
    _save(v3, a.outdir, 'missing_bytes_fuse_unk', names)
    v4 = json.loads(json.dumps(v2))
    v4['model']['byte_fallback'] = True
    for b in range(256):
        v4['model']['vocab']['<0x%02X>' % b] = nid + 1 + b
    _save(v4, a.outdir, 'missing_bytes_fallback', names)
    # added tokens with every flag, built through the library so the file is what it writes
    tok = Tokenizer.from_file(a.tokenizer)
    tok.add_tokens([AddedToken('ström', single_word=True), AddedToken('[MASK]', lstrip=True, rstrip=True),
                    AddedToken('中文', normalized=True), AddedToken('<ph>', normalized=False, rstrip=True),
                    AddedToken(' spaced ', normalized=False)])
    tok.add_special_tokens([AddedToken('<|sep|>', lstrip=True), AddedToken('<|endoftext|>x', special=True)])
    tok.save(os.path.join(a.outdir, 'added_flags.json'))
    names.append('added_flags')
    print(' '.join(names))


def _stem(path):
    return os.path.splitext(os.path.basename(path))[0]


def cmd_encode(a):
    from tokenizers import Tokenizer
    texts = []
    for path in a.text:
        with open(path, 'rb') as f:
            raw = f.read()
        texts.append((_stem(path), raw, raw.decode('utf-8')))
    for tpath in a.tokenizers:
        tok = Tokenizer.from_file(tpath)
        for name, raw, text in texts:
            ids = tok.encode(text, add_special_tokens=False).ids
            base = os.path.join(a.out_dir, _stem(tpath) + '__' + name)
            with open(base + '.ids', 'wb') as f:
                f.write(struct.pack('<%dI' % len(ids), *ids))
            back = tok.decode(ids, skip_special_tokens=False)
            with open(base + '.roundtrip', 'w') as f:
                f.write('1' if back.encode() == raw else '0')


def cmd_autotokenizer(a):
    from transformers import AutoTokenizer
    tok = AutoTokenizer.from_pretrained(a.dir)
    with open(a.text, 'rb') as f:
        text = f.read().decode('utf-8')
    with open(a.ids, 'rb') as f:
        data = f.read()
    want = list(struct.unpack('<%dI' % (len(data) // 4), data))
    got = tok.encode(text, add_special_tokens=False)
    if got != want:
        first = next((i for i, (x, y) in enumerate(zip(got, want)) if x != y), min(len(got), len(want)))
        sys.exit('AutoTokenizer(%s) differs at id %d of %d/%d' % (a.dir, first, len(got), len(want)))
    print('ok %d ids' % len(got))


ADVERSARIAL = ['a', 'b', 'e', 'x', ' ', '  ', '\t', '\n', '\r\n', '\r', '\u0301', '\u0300', '\u0327', '\u2581',
               '\u2581\u2581', '<s>', '</s>', '<unk>', '<|endoftext|>', '<|im_start|>', '1', '23', '456', '\u4e2d',
               '\u6587', '\uac00', '\u1100', '\u1161', '\u11a8', '\ufb01', '\uff21', '\u2460', '\U0001F600', '\u200d',
               '\u00e9', '\u0915', '\u094d', '\u0937', '.', ',', "'s", "'S", '\u00a0', '\u3000', '\u180e', '\x00',
               '\ufeff', '\u212b', '<0x41>']


def cmd_adversarial(a):
    from tokenizers import Tokenizer
    rng = random.Random(a.seed)
    texts = [''.join(rng.choice(ADVERSARIAL) for _ in range(rng.randint(0, 60))) for _ in range(a.count)]
    with open(os.path.join(a.outdir, 'texts.bin'), 'wb') as f:
        for t in texts:
            b = t.encode()
            f.write(struct.pack('<I', len(b)) + b)
    for path in a.tokenizers:
        tok = Tokenizer.from_file(path)
        with open(os.path.join(a.outdir, _stem(path) + '.adv'), 'wb') as f:
            for t in texts:
                ids = tok.encode(t, add_special_tokens=False).ids
                d = tok.decode(ids, skip_special_tokens=False).encode()
                f.write(struct.pack('<I%dI' % len(ids), len(ids), *ids) + struct.pack('<I', len(d)) + d)


def cmd_fixtures(a):
    import make_fixtures
    print(' '.join(make_fixtures.build(a.outdir, a.texts)))


def cmd_bench(a):
    os.environ['RAYON_NUM_THREADS'] = '1'
    os.environ['TOKENIZERS_PARALLELISM'] = 'false'
    from tokenizers import Tokenizer
    tok = Tokenizer.from_file(a.tokenizer)
    with open(a.text, 'rb') as f:
        raw = f.read()
    text = raw.decode('utf-8')
    docs = text.split('\n\n')
    best, method, ids = float('inf'), '', None
    fast = getattr(tok, 'encode_batch_fast', None)
    for _ in range(a.repeat):
        t0 = time.perf_counter()
        ids = tok.encode(text, add_special_tokens=False).ids
        dt = time.perf_counter() - t0
        if dt < best:
            best, method = dt, 'encode'
        if fast:
            t0 = time.perf_counter()
            fast(docs, add_special_tokens=False)
            dt = time.perf_counter() - t0
            if dt < best:
                best, method = dt, 'encode_batch_fast'
    with open(a.ids, 'wb') as f:
        f.write(struct.pack('<%dI' % len(ids), *ids))
    print('mb_s=%.3f method=%s' % (len(raw) / best / 1e6, method))


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = p.add_subparsers(dest='cmd', required=True)
    c = sub.add_parser('corpus')
    c.add_argument('out')
    c.add_argument('--bytes', type=int, required=True)
    c.add_argument('--seed', type=int, default=1)
    c.add_argument('--src', action='append', default=[])
    c.add_argument('--multiscript', type=float, default=0.5)
    c.add_argument('--skip', type=int, default=0)
    c = sub.add_parser('multiscript')
    c.add_argument('out')
    c.add_argument('--bytes', type=int, required=True)
    c.add_argument('--seed', type=int, default=1)
    c = sub.add_parser('train')
    c.add_argument('--style', choices=['gpt2', 'llama3', 'qwen2', 'spm'], required=True)
    c.add_argument('--vocab', type=int, required=True)
    c.add_argument('--out', required=True)
    c.add_argument('--special', action='append')
    c.add_argument('files', nargs='+')
    c = sub.add_parser('variants')
    c.add_argument('tokenizer')
    c.add_argument('outdir')
    c = sub.add_parser('encode')
    c.add_argument('--out-dir', required=True)
    c.add_argument('--text', action='append', required=True)
    c.add_argument('tokenizers', nargs='+')
    c = sub.add_parser('autotokenizer')
    c.add_argument('dir')
    c.add_argument('text')
    c.add_argument('ids')
    c = sub.add_parser('adversarial')
    c.add_argument('outdir')
    c.add_argument('--seed', type=int, default=1)
    c.add_argument('--count', type=int, default=1000)
    c.add_argument('tokenizers', nargs='+')
    c = sub.add_parser('fixtures')
    c.add_argument('outdir')
    c.add_argument('texts', nargs='+')
    c = sub.add_parser('bench')
    c.add_argument('tokenizer')
    c.add_argument('text')
    c.add_argument('ids')
    c.add_argument('--repeat', type=int, default=3)
    a = p.parse_args()
    globals()['cmd_' + a.cmd](a)


if __name__ == '__main__':
    main()
