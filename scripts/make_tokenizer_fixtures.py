#!/usr/bin/env python3
"""Makes the tokenizer fixtures of tests/fixtures/tokenizer/ with Hugging Face `tokenizers`.

Run where `tokenizers` is installed from PyPI (`pip install tokenizers`); not in CI, whose test
(test_tokenizer) reads the committed outputs:

  tokenizer.json          a byte-level BPE (vocab 1000) trained on TRAIN_TEXT below, GPT-2's layout:
                          ByteLevel pre-tokenizer (the GPT-2 pattern), decoder and post-processor,
                          the special token <|endoftext|> and an ordinary added token, as GPT-J has
  tokenizer_prefix.json   the same model with add_prefix_space=true
  reference.json          for each case of CASES (text the tokenizer was not trained on): its raw
                          bytes (hex), the ids `tokenizers` gives for them, what it decodes those ids
                          to (hex), and what it decodes each id alone to (lossy, hex)

Invalid UTF-8: `tokenizers` takes text, not bytes, so a case's bytes are first decoded as Python's
bytes.decode("utf-8", errors="replace") does (each maximal invalid subpart becomes U+FFFD); nax's
tokenizer does the same on bytes. Decoding is lossy too: bytes that do not form UTF-8 become U+FFFD.

  python3 scripts/make_tokenizer_fixtures.py [--out tests/fixtures/tokenizer]
"""
import argparse
import json
import os

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

TRAIN_TEXT = """\
The quick brown fox jumps over the lazy dog. It's a sentence we've all seen, and they'll see it again;
I'm sure you'd agree that it's short. She said: "Don't stop!" -- he didn't.
Numbers: 0 1 2 3 42 1234567890 3.14159 2026-12-04 +49 (0)30 555-0199, 1e-6, 0x1F, 50% off.
Code: for (int i = 0; i < n; ++i) { sum += a[i] * b[i]; } // dot product
def tokenize(text): return [ord(c) for c in text]  # bytes, not characters
Whitespace:   three spaces,\ttabs\t\tand
newlines

blank lines, trailing spaces   
    indented code blocks
Français: déjà vu, garçon, où est la bibliothèque? Ça va très bien, merci.
Deutsch: Größe, Straße, Übermäßig schön, fünf Äpfel für Jürgen.
Español: ¿Dónde está la estación? ¡Mañana será otro día!
Русский: Съешь же ещё этих мягких французских булок, да выпей чаю.
Ελληνικά: Ξεσκεπάζω την ψυχοφθόρα βδελυγμία.
日本語: 私はガラスを食べられます。それは私を傷つけません。
中文: 我能吞下玻璃而不伤身体。你好，世界！
한국어: 나는 유리를 먹을 수 있어요. 그래도 아프지 않아요.
العربية: أنا قادر على أكل الزجاج و هذا لا يؤلمني.
עברית: אני יכול לאכול זכוכית וזה לא מזיק לי.
हिन्दी: मैं काँच खा सकता हूँ और मुझे उससे कोई चोट नहीं पहुंचती.
Emoji: 😀 😃 😄 👍🏽 ❤️ 🇩🇪 👩‍👩‍👧‍👦 🚀✨ and text 🙂 between.
Digits in other scripts: ٠١٢٣٤٥٦٧٨٩ ०१२३४५६७८९ ①②③ Ⅻ ½ ¾.
Punctuation runs: ... --- !!! ??? ::: ;;; *** ### @@@ $$$ %%% ^^^ &&& ((( ))) [[[ ]]] {{{ }}}
Contractions: I'll, you'll, we're, they're, isn't, can't, won't, shouldn't've, y'all, o'clock, 'tis.
Upper case: IT'S, WE'LL, THEY'VE, I'D, YOU'RE, I'M, HE'S -- the pattern's contractions are lower case.
<|endoftext|>
A second document begins after the end-of-text token. Mixed: abc123def ４５６ ｆｕｌｌｗｉｄｔｈ.
"""

# (name, bytes): text the tokenizer was not trained on.
CASES = [
    ("ascii", b"Hello, world! This is a test of the tokenizer we've trained."),
    ("contractions", b"I'm sure it's what you'd've done; they'll say we're fine, it'S and IT'S aren't. 'twas 'll'"),
    ("whitespace_runs", b"a  b   c\t\td\n\ne \n \n  f    \n\tg   "),
    ("leading_trailing", b"   spaces before and after   "),
    ("unicode_whitespace", "nbsp\u00a0here, ideographic\u3000space, line\u2028sep, nel\u0085char, thin\u2009\u2009space \u00a0 ".encode()),
    ("letters", "Ünïcödé lëttérs: Ærøskøbing, Łódź, Ελλάδα, Москва, İstanbul, ß ẞ".encode()),
    ("digits", "Digits 123 4567 89012345 ٣٤٥ १२३ ¹²³ ①② ⅫⅣ ½ 3.5e-7 ４５".encode()),
    ("cjk", "東京は日本の首都です。我爱北京天安门。한국어 문장입니다. カタカナとひらがな".encode()),
    ("emoji", "Emoji 😀👍🏽 ❤️🇩🇪 👩‍👩‍👧‍👦 🚀🚀🚀 🫠 done".encode()),
    ("special_token", b"first doc<|endoftext|>second doc <|endoftext|> third<|extratoken_1|>x"),
    ("invalid_utf8", b"bad \xff byte, truncated \xe6\x97 char, lone \x80\x80 continuation, overlong \xc0\xaf, surrogate \xed\xa0\x80, ok \xe6\x97\xa5"),
    ("invalid_at_end", b"ends in a cut char \xf0\x9f\x98"),
    ("control", b"nul\x00char bell\x07 del\x7f esc\x1b[0m"),
    ("empty", b""),
    ("long_word", b"Supercalifragilisticexpialidocious antidisestablishmentarianism " * 3),
]


def build(add_prefix_space):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=add_prefix_space)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=True)
    return tok


def reference(tok, cases):
    out = []
    for name, raw in cases:
        text = raw.decode("utf-8", errors="replace")
        ids = tok.encode(text).ids
        out.append({
            "name": name,
            "bytes_hex": raw.hex(),
            "ids": ids,
            "decoded_hex": tok.decode(ids, skip_special_tokens=False).encode().hex(),
            "decoded_skip_special_hex": tok.decode(ids, skip_special_tokens=True).encode().hex(),
            "each_decoded_hex": [tok.decode([i], skip_special_tokens=False).encode().hex() for i in ids],
        })
    return out


def main():
    here = os.path.dirname(os.path.abspath(__file__))
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", default=os.path.join(here, "..", "tests", "fixtures", "tokenizer"))
    args = parser.parse_args()
    os.makedirs(args.out, exist_ok=True)

    import tokenizers

    tok = build(add_prefix_space=False)
    trainer = trainers.BpeTrainer(vocab_size=1000, min_frequency=1, special_tokens=["<|endoftext|>"],
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet(), show_progress=False)
    tok.train_from_iterator([TRAIN_TEXT], trainer=trainer)
    tok.add_tokens(["<|extratoken_1|>"])  # an added token that is not special, as GPT-J's
    tok.save(os.path.join(args.out, "tokenizer.json"))

    prefixed = Tokenizer.from_str(tok.to_str())
    prefixed.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=True)
    prefixed.save(os.path.join(args.out, "tokenizer_prefix.json"))

    ref = {
        "generator": f"scripts/make_tokenizer_fixtures.py with tokenizers {tokenizers.__version__}",
        "vocab_size": tok.get_vocab_size(with_added_tokens=True),
        "tokenizer": reference(tok, CASES),
        "tokenizer_prefix": reference(prefixed, CASES),
    }
    with open(os.path.join(args.out, "reference.json"), "w") as f:
        json.dump(ref, f, indent=1, ensure_ascii=True)
        f.write("\n")
    print(f"wrote {args.out}: vocab {ref['vocab_size']}, {len(CASES)} cases")


if __name__ == "__main__":
    main()
