"""The built-in corpus and prompts of the toy tokenizers and pairs (:mod:`hf_hetspec.testing.toy`)."""

from __future__ import annotations

from typing import Sequence


# --------------------------------------------------------------------------------------------------------
# Built-in corpus
# --------------------------------------------------------------------------------------------------------

#: Documents of the built-in corpus: English prose, Python with indentation, numbers, CJK, emoji, lines
#: with trailing spaces and tabs. The models of :func:`correlated_pair` memorize these; prompts are prefixes.
#: (No string that a real tokenizer parses as a special token, e.g. ``<eos>`` or ``<|im_end|>``, occurs.)
TOY_CORPUS: tuple[str, ...] = (
    "The lighthouse keeper climbed the spiral stairs every evening at dusk. He counted one hundred and "
    "twelve steps, polished the great lens with a soft cloth, and wrote the weather in a leather book. "
    "Ships passed far out on the grey water, and none of them ever knew his name.",
    "def fibonacci(n: int) -> int:\n"
    '    """Return the n-th Fibonacci number."""\n'
    "    a, b = 0, 1\n"
    "    for _ in range(n):\n"
    "        a, b = b, a + b\n"
    "    return a\n"
    "\n"
    "\n"
    "if __name__ == \"__main__\":\n"
    "    print([fibonacci(i) for i in range(10)])\n",
    "Speculative decoding lets a small drafter propose several tokens that a large target model then "
    "verifies in a single forward pass. When the drafter guesses well, many tokens are accepted at once "
    "and generation becomes faster, while the output distribution stays exactly the same.",
    "class Stack:\n"
    "    def __init__(self):\n"
    "        self.items = []\n"
    "\n"
    "    def push(self, item):\n"
    "        self.items.append(item)\n"
    "\n"
    "    def pop(self):\n"
    "        if not self.items:\n"
    "            raise IndexError(\"pop from an empty stack\")\n"
    "        return self.items.pop()\n",
    "On 14 March 2024 the station recorded 3.14159 mm of rain, 27 km/h winds and a pressure of 1013.25 hPa. "
    "The next morning was clear: 18 degrees at 07:30, 24 degrees by noon, and 2,048 visitors on the beach.",
    "Our small garden grows tomatoes, basil, beans and three kinds of mint. In summer we water it twice a "
    "day; in winter we cover the beds with straw and wait for the first green shoots of spring.",
    "今天天气很好，我们去公园散步。春天来了，花都开了。\n"
    "東京の駅はとても大きいです。毎朝たくさんの人が電車に乗ります。\n"
    "서울의 가을 하늘은 맑고 높습니다.",
    "Party checklist 🎉: cake 🎂, candles 🕯️, music 🎵 and friends 😀! "
    "Do not forget the gifts 🎁 and "
    "the photos 📷. The cat 🐈 will sleep through all of it.",
    "Shopping list:   \n"
    "  - eggs (12)  \n"
    "  - flour, 500 g\t\n"
    "  - milk, 1.5 l   \n"
    "Remember: the shop closes at 8 pm.  ",
    "import json\n"
    "\n"
    "def load_config(path):\n"
    "    with open(path, encoding=\"utf-8\") as handle:\n"
    "        data = json.load(handle)\n"
    "    return {key.lower(): value for key, value in data.items()}\n",
    "A river does not hurry, yet it reaches the sea. It carves valleys from stone one grain at a time, "
    "and every bend it makes was once a choice between two easier paths.",
    '{"name": "hetspec", "version": "0.1.0", "tags": ["speculative", "decoding"], "max_tokens": 256, '
    '"temperature": 0.7, "stop": null}',
    "Recipe for pancakes: mix 200 g of flour, 2 eggs and 300 ml of milk. Let the batter rest for 30 minutes, "
    "then cook each pancake for 90 seconds on each side in a hot pan.",
    "for row in range(3):\n"
    "\tfor col in range(4):\n"
    "\t\tprint(row * col, end=\" \")\n"
    "\tprint()\n",
)

#: Prompts for :func:`correlated_pair`: prefixes of :data:`TOY_CORPUS` documents cut after a word (never
#: before a space), so a model that memorized the corpus continues them deterministically.
TOY_PROMPTS: tuple[str, ...] = (
    "The lighthouse keeper climbed",
    'def fibonacci(n: int) -> int:\n    """Return',
    "Speculative decoding lets a small",
    "class Stack:\n    def __init__(self):\n        self.items",
    "On 14 March 2024 the station",
    "Our small garden grows",
    "import json\n\ndef load_config(path):\n    with open(path,",
    "A river does not hurry,",
    "Party checklist 🎉: cake",
    "Recipe for pancakes: mix",
)

#: ChatML chat template (Qwen / SmolLM2 style) used by :func:`byte_level_bpe_tokenizer`.
def _corpus(corpus: Sequence[str] | None) -> tuple[str, ...]:
    if corpus is None:
        return TOY_CORPUS
    if isinstance(corpus, str):
        raise TypeError("corpus must be a sequence of documents (strings), not a single string")
    docs = tuple(corpus)
    if not docs or not all(isinstance(d, str) and d for d in docs):
        raise ValueError("corpus must be a non-empty sequence of non-empty strings")
    return docs
