"""The built-in English text the `tiny` tokenizer is trained on at build time.

Owned here so the tokenizer is reproducible from the source tree alone: the same text always
yields the same merges and ids. It mixes prose, chat turns, code-ish lines, numbers and
punctuation so the byte-level BPE learns merges for the kinds of text tests and demos send.
It is a Python constant rather than a data file so a non-editable install ships it.
"""

from __future__ import annotations

CORPUS: tuple[str, ...] = (
    """The quick brown fox jumps over the lazy dog. The dog does not mind; it has seen the fox
before and knows that the fox only wants to show how fast it can run. A small board with two
chips sits in a rack in a cold room, and every few milliseconds it produces one more token of
text for someone who asked a question far away.""",
    """Hello! How can I help you today? I would like to know how the weather will be tomorrow.
Tomorrow will be sunny in the morning, with clouds in the afternoon and a little rain in the
evening. Thank you, that is very helpful. You are welcome. Is there anything else you need?""",
    """A model package is a folder of files. Each file has a size, a hash and a role. The
manifest lists every file, the shapes of the inputs and outputs, the number of layers, the
size of the vocabulary and the memory that each chip needs. If a file is missing, or if its
hash does not match, the package is rejected before anything is loaded onto the device.""",
    """The scheduler keeps a queue of requests. When a lane is free, the next prompt is
prefilled into it. Then the lane joins the decode batch, and one token is produced for every
active lane in each step. When a sequence reaches the end of its text, its lane is released
and another request can use it. Nothing waits in a busy loop; everything waits on an event.""",
    """Once upon a time there was a little robot who lived in a library. Every night, when the
people had gone home, the robot read one book from the shelves. It read stories about the sea,
about mountains and about cities full of light. In the morning it put the book back, exactly
where it had found it, and waited for the doors to open again.""",
    """def add(a, b):
    return a + b

for i in range(10):
    print(i, add(i, i * 2))

if value is None:
    raise ValueError("value must not be None")
""",
    """The numbers are 0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 16, 32, 64, 128, 256, 512, 1024, 2048,
4096, 8192, 16384, 32768 and 40960. One point five is written 1.5 and a quarter is 0.25. The
year 2026 has twelve months; the meeting is at 10:30 on the 2nd of August.""",
    """Question: What is the capital of France? Answer: The capital of France is Paris.
Question: How many legs does a spider have? Answer: A spider has eight legs.
Question: Why is the sky blue? Answer: Sunlight is scattered by the air, and blue light is
scattered more than red light, so the sky looks blue during the day.""",
    """Please write a short poem about the sea.
The sea is wide, the sea is deep,
it sings the sailors all to sleep;
it keeps its secrets, old and cold,
in waves of silver, green and gold.""",
    """Operators watch the health of every board. If a board stops answering, it is drained,
reset and warmed up again with a known prompt, and its answers are compared with the expected
tokens. Only when the answers match does the board take traffic again. Errors are counted,
logged and explained, so that the next person on call understands what happened and why.""",
    """Good morning, everyone. Today we will talk about memory. Each chip has its own memory
for parameters, for the key and value cache, and for the work space of the graph. The cache
grows with the length of the context: longer prompts need more memory, and more lanes need
more memory too. We must always check that the sum fits before we change anything.""",
    """She said: "I don't think it's ready yet." He answered: "It isn't, but it will be soon."
They laughed, packed their bags and walked to the station, where the last train of the day
was waiting with its doors open and its lights on.""",
)
"""Paragraphs trained on; the trainer sees them as separate sequences (no cross-paragraph merges)."""
