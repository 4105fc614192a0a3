"""Built-in benchmark sentences: English and Chinese, short to long.

``load_texts(kind)`` returns ``[(id, text, language)]``; ``load_dataset(path)`` reads a seed-tts
style file (``id<TAB>text`` per line; further tab-separated columns are ignored; blank lines and
lines starting with ``#`` are skipped; a line without a tab uses its line number as id).
"""

from __future__ import annotations

from typing import List, Optional, Tuple

ENGLISH = [
    ("en_s1", "Hello there."),
    ("en_s2", "Good morning, how are you today?"),
    ("en_s3", "Please turn left at the next intersection."),
    ("en_m1", "The quick brown fox jumps over the lazy dog, and then it runs back into the forest."),
    ("en_m2", "Your package has been shipped and should arrive within three to five business days."),
    ("en_m3", "I was wondering whether you could help me find a quiet place to read this afternoon."),
    (
        "en_l1",
        "Streaming speech synthesis lets a listener hear the first words of an answer while the rest "
        "of the sentence is still being generated, which makes a voice assistant feel much more responsive.",
    ),
    (
        "en_l2",
        "Before you leave the laboratory, make sure that every instrument is switched off, the samples are "
        "labelled and stored in the refrigerator, and the door is locked behind you.",
    ),
    (
        "en_xl1",
        "Once upon a time, in a small village at the edge of a great forest, there lived an old clockmaker "
        "who spent his days repairing watches for travellers. One winter evening a stranger knocked on his "
        "door, carrying a clock that had not ticked for a hundred years, and asked him to make it run again.",
    ),
]

CHINESE = [
    ("zh_s1", "你好。"),
    ("zh_s2", "今天天气怎么样？"),
    ("zh_s3", "请在下一个路口左转。"),
    ("zh_m1", "我想预订明天晚上七点的位子，一共四个人，最好靠窗。"),
    ("zh_m2", "您的包裹已经发出，预计三到五个工作日内送达。"),
    ("zh_m3", "周末我们一起去公园散步吧，听说那里的花都开了。"),
    (
        "zh_l1",
        "流式语音合成可以让听众在句子其余部分还在生成的时候，就先听到回答的前几个字，这让语音助手的响应显得更加及时自然。",
    ),
    ("zh_l2", "离开实验室之前，请确认所有仪器都已关闭，样品都贴好标签并放进冰箱，最后别忘了锁门。"),
    (
        "zh_xl1",
        "很久以前，在一片大森林的边上有一个小村庄，村里住着一位年老的钟表匠，他每天为过路的旅人修理手表。"
        "一个冬天的傍晚，一位陌生人敲开了他的门，带来一座已经一百年没有走动的老钟，请他让它重新走起来。",
    ),
]


def load_texts(kind: str = "all") -> List[Tuple[str, str, Optional[str]]]:
    """``kind``: ``en``, ``zh`` or ``all``. The third field is the language to send
    (``english``/``chinese``)."""
    en = [(i, t, "english") for i, t in ENGLISH]
    zh = [(i, t, "chinese") for i, t in CHINESE]
    if kind == "en":
        return en
    if kind == "zh":
        return zh
    if kind == "all":
        return en + zh
    raise ValueError(f"unknown text set {kind!r}: en, zh or all")


def load_dataset(path: str) -> List[Tuple[str, str, Optional[str]]]:
    """Read ``id<TAB>text`` lines (seed-tts format); the language is left to the server/CLI."""
    out = []
    with open(path, encoding="utf-8") as f:
        for n, line in enumerate(f, 1):
            line = line.rstrip("\r\n")
            if not line.strip() or line.lstrip().startswith("#"):
                continue
            parts = line.split("\t")
            if len(parts) == 1:
                uid, text = f"line{n}", parts[0]
            else:
                uid, text = parts[0], parts[1]
            text = text.strip()
            if text:
                out.append((uid.strip() or f"line{n}", text, None))
    if not out:
        raise ValueError(f"{path}: no texts found (expected 'id<TAB>text' lines)")
    return out
