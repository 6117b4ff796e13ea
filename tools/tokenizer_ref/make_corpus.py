#!/usr/bin/env python3
"""Writes the tokenizer parity corpus: one JSON string per line, deterministic (seeded).

Covers many scripts, code, emoji and ZWJ sequences, combining marks, digits of every length,
whitespace runs, contractions in any case, special-token strings inside text, long words.
usage: make_corpus.py OUT.jsonl
"""
import json
import random
import sys

R = random.Random(20261130)

WORDS = ("the of and to in is you that it he was for on are as with his they I at be this have "
         "from or one had by word but not what all were we when your can said there use an each "
         "which she do how their if will up other about out many then them these so some her "
         "would make like him into time has look two more write go see number no way could people "
         "my than first water been call who oil its now find long down day did get come made may "
         "part tokenizer inference engine expert mixture quantization bandwidth kernel").split()

SCRIPTS = {
    "latin_ext": "àáâãäåæçèéêëìíîïðñòóôõöøùúûüýþÿāăąćčďđēėęěğīįıłńňőœřśşšťūůűųźżžǎǐǒǔ",
    "greek": "αβγδεζηθικλμνξοπρστυφχψωΑΒΓΔΕΖΗΘΙΚΛΜΝΞΟΠΡΣΤΥΦΧΨΩάέήίόύώϊϋΐΰ",
    "cyrillic": "абвгдеёжзийклмнопрстуфхцчшщъыьэюяАБВГДЕЁЖЗИЙКЛМНОПРСТУФХЦЧШЩЪЫЬЭЮЯіїєґ",
    "arabic": "ابتثجحخدذرزسشصضطظعغفقكلمنهويءآأؤإئةى",
    "hebrew": "אבגדהוזחטיכלמנסעפצקרשתךםןףץ",
    "devanagari": "अआइईउऊऋएऐओऔकखगघङचछजझञटठडढणतथदधनपफबभमयरलवशषसहािीुूृेैोौंः्",
    "thai": "กขฃคฅฆงจฉชซฌญฎฏฐฑฒณดตถทธนบปผฝพฟภมยรลวศษสหฬอฮะัาำิีึืุูเแโใไ่้๊๋",
    "han": "的一是不了人我在有他这中大来上国个到说们为子和你地出道也时年得就那要下以生会自着去之过家学对可她里后小么心多天而能好都然没日于起还发成事只作当想看文无开手十用主行方又如前所本见经头面公同三已老从动两长",
    "hiragana": "あいうえおかきくけこさしすせそたちつてとなにぬねのはひふへほまみむめもやゆよらりるれろわをんがぎぐげござじずぜぞだぢづでどばびぶべぼぱぴぷぺぽゃゅょっ",
    "katakana": "アイウエオカキクケコサシスセソタチツテトナニヌネノハヒフヘホマミムメモヤユヨラリルレロワヲンガギグゲゴーッャュョ",
    "hangul": "가나다라마바사아자차카타파하한국어는글을를이가에서의로와과도만",
    "georgian": "აბგდევზთიკლმნოპჟრსტუფქღყშჩცძწჭხჯჰ",
    "armenian": "աբգդեզէըթժիլխծկհձղճմյնշոչպջռսվտրցւփքօֆ",
    "ethiopic": "ሀሁሂሃሄህሆለሉሊላሌልሎመሙሚማሜምሞ",
    "tamil": "அஆஇஈஉஊஎஏஐஒஓஔகஙசஞடணதநபமயரலவழளறனாிீுூெேைொோௌ்",
    "math": "∀∂∃∅∇∈∉∋∏∑−∓∗∘√∝∞∠∧∨∩∪∫∴∼≅≈≠≡≤≥⊂⊃⊆⊇⊕⊗⊥⋅⌈⌉⌊⌋〈〉",
    "symbols": "©®™°±²³µ¶·¹º¼½¾×÷€£¥¢§¤†‡•…‰′″‹›«»—–‘’“”„‽⁂☀☁☂★☆☎☐☑☒♀♂♠♣♥♦♪♫✓✔✗✘",
    "fullwidth": "ＡＢＣａｂｃ０１２３！＂＃＄％＆（）＊＋，－．／：；＜＝＞？＠［＼］＾＿｀｛｜｝～、。「」『』【】",
}
COMBINING = [chr(c) for c in range(0x300, 0x36F)]
EMOJI = ["😀", "😂", "🥲", "😍", "🤔", "🙃", "👍", "👍🏽", "👋🏿", "🎉", "🔥", "💯", "🚀", "🌍", "❤️", "✨",
         "👨‍👩‍👧‍👦", "👩🏾‍💻", "🏳️‍🌈", "🧑‍🤝‍🧑", "👁️‍🗨️", "🇺🇸", "🇯🇵", "🇩🇪", "🏴‍☠️", "☺︎", "1️⃣", "#️⃣",
         "🫠", "🪿", "🧬", "🦀", "🐍", "🤖", "👨‍🚀", "🧔‍♀️"]
SPACES = [" ", "  ", "\t", "\n", "\n\n", "\r\n", " \n", "\n ", "   \t ", "\u00a0", "\u3000", "\u2009",
          "\u200b", "\u2028", "\f", "\v"]
CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d"]
SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<think>", "</think>", "<tool_call>",
            "</tool_call>", "<|vision_pad|>", "<｜begin▁of▁sentence｜>", "<｜end▁of▁sentence｜>",
            "<｜User｜>", "<｜Assistant｜>", "<｜tool▁calls▁begin｜>", "<｜fim▁hole｜>", "<|im_start",
            "im_end|>", "<｜User", "<｜▁pad▁｜>", "<s>", "</s>", "<|", "|>"]
CODE = [
    "def f(x):\n    return x ** 2 + 1  # square\n",
    "for (int i = 0; i < n; ++i) {\n\tsum += a[i] * b[i];\n}\n",
    "const xs = [1, 2, 3].map((v) => v * 2);\nconsole.log(`${xs}`);",
    '{"name": "tetra", "version": 1.0, "tags": ["moe", "nvfp4"], "ok": true, "n": null}',
    "SELECT id, name FROM users WHERE age >= 18 ORDER BY name DESC;",
    "#include <vector>\ntemplate <typename T> T max(T a, T b) { return a > b ? a : b; }",
    "fn main() { let v: Vec<u8> = vec![0xff; 16]; println!(\"{:?}\", v); }",
    "    if self.x is not None and len(self.y) > 0:\n        raise ValueError('bad')\n",
    "<div class=\"a\"><p>Hello &amp; welcome</p></div>",
    "$ ./build/tetra tokenize --model /models/qwen3 --text 'hi' --json | jq .ids",
    "x = {'a': [1,2,{'b': (3,4)}]}; print(x['a'][2]['b'][0])",
    "https://example.com/path/to/page?query=1&x=y#frag and mailto:user@example.org",
    "C:\\Users\\me\\Documents\\file.txt",
    "a+b=c; a-b==d; a*b!=e; a/b<=f; a%b>=g; a^b||h&&i; ~a<<2>>3",
    "@decorator\nclass Foo(Bar, metaclass=Meta):\n    '''doc'''\n    pass\n",
]


def words(n):
    return " ".join(R.choice(WORDS) for _ in range(n))


def script_word(name, lo=1, hi=8):
    chars = SCRIPTS[name]
    return "".join(R.choice(chars) for _ in range(R.randint(lo, hi)))


def random_case(s):
    return "".join(c.upper() if R.random() < 0.5 else c.lower() for c in s)


def gen():
    out = []
    # Fixed edge cases first.
    out += ["", " ", "  ", "a", "\n", "\t", "\r\n", "\x00", "a\x00b", "\x01\x02\x1f\x7f", "\u00ad",
            "'", "''", "'s", "'S", "'Re", "'LL", "don't", "DON'T", "Don'T", "I'M", "we'Ve",
            "it's it'S IT'S", "'''s", "a'b'c'd", "x's'", "  'll", "\n's", "1's", "é's",
            "e\u0301", "\u00e9", "n\u0303o", "A\u030a", "\u1100\u1161\u11a8", "\u212b", "\u2126",
            "\u0958", "ｶﾞ", "ﬁ", "\ufb01x", "x\u0308\u0301\u0323", "\u0301start", "\u0345",
            "0", "00", "000", "0000", "1234567890", "3.14159", "1,000,000", "1e-9", "0x1F",
            "١٢٣٤٥٦", "१२३४", "½", "²³", "Ⅻ", "①②③", "𝟘𝟙𝟚", "٣٫٥",
            "\U0001F600", "\U0001F468\u200d\U0001F469\u200d\U0001F467", "\u200d", "\ufe0f",
            "\U0010FFFF", "\U000E0041", "\U0001FABF \U0001FACE\U0001FA89!", "\U00031350\U00031351 x",
            "a\U00011F04\U00011F05 \U00011F50", "\U0001E4D0\U0001E4F0", "\U0001D2C0\U0001D2C1", "\uE000", "\uFFFD", "\uFFFF", "𝕳𝖊𝖑𝖑𝖔", "𐍈", "𓀀"]
    for n in range(1, 41):  # digits of every length
        out.append("".join(R.choice("0123456789") for _ in range(n)))
        out.append("x" + "".join(R.choice("0123456789") for _ in range(n)) + " y")
    for n in [1, 2, 3, 4, 5, 7, 8, 15, 16, 17, 31, 32, 33, 64, 100, 257, 1000]:
        for ch in [" ", "\n", "\t", "\r\n", " \n", "\u3000", "\u00a0"]:
            out.append(ch * n)
            out.append("a" + ch * n + "b")
            out.append(ch * n + "word")
    for c in CONTRACTIONS:
        for _ in range(6):
            out.append(random_case("it" + c + " " + R.choice(WORDS) + c))
    for s in SPECIALS:
        for tmpl in ["{s}", "a{s}b", " {s} ", "{s}{s}", "x {s}\n{s}y", "{s}hello world", "<{s}>"]:
            out.append(tmpl.format(s=s))
    for c in CODE:
        out.append(c)
        out.append(c * 3)
    for name in SCRIPTS:
        for _ in range(25):
            k = R.randint(1, 6)
            out.append(" ".join(script_word(name) for _ in range(k)))
        out.append(script_word(name, 200, 400))
    for _ in range(150):
        out.append(words(R.randint(1, 40)) + R.choice([".", "!", "?", ",", "", "...", "?!"]))
    for _ in range(120):
        s = "".join(R.choice(EMOJI) + R.choice(["", " ", "x", "\u200d", "！"]) for _ in range(R.randint(1, 8)))
        out.append(s)
    for _ in range(100):
        base = R.choice("aeiouxyzAEIOU" + SCRIPTS["greek"][:5] + SCRIPTS["cyrillic"][:5])
        out.append(base + "".join(R.choice(COMBINING) for _ in range(R.randint(1, 12))) + " " + words(2))
    for _ in range(150):  # mixed soup
        parts = []
        for _ in range(R.randint(2, 12)):
            kind = R.randrange(8)
            if kind == 0:
                parts.append(words(R.randint(1, 4)))
            elif kind == 1:
                parts.append(script_word(R.choice(list(SCRIPTS))))
            elif kind == 2:
                parts.append(R.choice(EMOJI))
            elif kind == 3:
                parts.append(R.choice(SPACES))
            elif kind == 4:
                parts.append(str(R.randint(0, 10 ** R.randint(1, 12))))
            elif kind == 5:
                parts.append(R.choice(SPECIALS))
            elif kind == 6:
                parts.append(R.choice("!@#$%^&*()_+-=[]{}|;:'\",.<>/?`~\\") * R.randint(1, 4))
            else:
                parts.append(random_case(R.choice(WORDS)) + R.choice(CONTRACTIONS))
        out.append("".join(parts))
    for _ in range(150):  # random code points from the BMP and beyond, valid scalars only
        cps = []
        for _ in range(R.randint(1, 20)):
            cp = R.choice([R.randint(0x20, 0x7E), R.randint(0xA0, 0x2FFF), R.randint(0x3000, 0xD7FF),
                           R.randint(0xE000, 0xFFFD), R.randint(0x10000, 0x1FAFF)])
            cps.append(chr(cp))
        out.append("".join(cps))
    for n in [100, 500, 1000, 3000, 10000]:  # very long words
        out.append("a" * n)
        out.append("".join(R.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(n)))
        out.append("ab" * (n // 2))
        out.append("的" * (n // 4))
        out.append("!" * n)
        out.append("1" * n)
        out.append("é" * (n // 2))
        out.append("x" + "\u0301" * (n // 10))
    for _ in range(200):  # whitespace-and-punctuation-heavy lines
        out.append("".join(R.choice(SPACES + [".", ",", "-", "--", "...", "'", '"', "(", ")", words(1)])
                           for _ in range(R.randint(2, 25))))
    for _ in range(150):  # newline structure like prompts and markdown
        lines = [R.choice(["# ", "## ", "- ", "* ", "1. ", "> ", "", "    ", "\t", "```", "| a | b |"]) + words(R.randint(0, 6))
                 for _ in range(R.randint(2, 8))]
        out.append(R.choice(["\n", "\n\n", "\r\n", " \n"]).join(lines))
    # Han by script, not script extensions (Kimi's pattern splits Han runs): CJK punctuation
    # such as 』、。 is Common; 々 and the Unicode 15/15.1 extensions H and I are Han.
    out += ["』<think>", "a、b。c", "「引用」quote", "々々x", "\U00031350\U00031351abc", "x\U0002EBF0y",
            "中文English混合text", "Ａ中ｂ", "\u3007\u3007\u3007", "\u2e80\u2f00abc"]
    return out


def main():
    corpus = gen()
    with open(sys.argv[1], "w", encoding="utf-8") as f:
        for s in corpus:
            f.write(json.dumps(s, ensure_ascii=True) + "\n")
    print(f"{len(corpus)} strings", file=sys.stderr)


if __name__ == "__main__":
    main()
