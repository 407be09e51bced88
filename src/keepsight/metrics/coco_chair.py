"""CHAIR on MS-COCO (Rohrbach et al. 2018, "Object Hallucination in Image Captioning"), stdlib only.

What is measured
----------------
A caption *mentions* a COCO object when one of its words (after singularisation and two-word merging)
is a synonym of one of the 80 COCO categories. A mention is *hallucinated* when its category is not
among the image's ground-truth objects, which are (as in the reference) the categories of the image's
instance annotations UNION the objects mentioned in its five reference captions.

  CHAIRi = hallucinated mentions / all mentions        (pooled over captions; every occurrence counts)
  CHAIRs = captions with >= 1 hallucinated mention / all captions
  recall = sum_c |objects mentioned by c that are in GT(c)| / sum_c |GT(c)|   (pooled, distinct objects)

Repeated mentions count each time in CHAIRi, as in the reference ``utils/chair.py`` (it adds
``len(node_words)`` per caption and counts hallucinations per word): "a dog and another dog" is two
mentions, and "a man and a woman" is two ``person`` mentions. (The older top-level ``chair.py`` of the
same repository deduplicated words per caption; ``utils/chair.py`` is the one the forks copy.) Recall
counts distinct objects and is pooled: it is the "Recall" that Maxlinn's standalone CHAIR and OPERA
print, the "cover" kind of recall (AMBER's "Cover" is the same idea, averaged per caption instead).
``mean_length`` is words per caption; OPERA's "Len" counts NLTK tokens, punctuation included.

Which published variant
-----------------------
The synonym list, the two-word phrases and the special rules are those of ``utils/chair.py`` and
``data/synonyms.txt`` in LisaAnne/Hallucination, as shipped standalone by Maxlinn/CHAIR-metric-standalone
and used by OPERA (shikiw/OPERA) and its followers; like those two we also merge "train track" (so a
train track is not a train). The rules:

* two-word phrases are merged greedily left to right on the singularised words ("hot dog",
  "teddy bear", "fire hydrant", "stop sign", "cell phone", "motor bike", ...), so "hot dog" is never a
  dog and "teddy bear" never a bear;
* "baby"/"adult" + an animal word (bird, cat, dog, horse, sheep, cow, elephant, bear, zebra, giraffe,
  animal, cub) is the animal, not a person ("baby elephant" -> elephant); there is no rule for "young";
* "passenger jet"/"passenger train" is the vehicle, not a person;
* "bow tie" is a tie; "toilet seat" is a toilet, and when a caption has both "toilet" and "seat" every
  "seat" is dropped (the seat of a toilet is not a chair).

Singularisation. The reference runs ``pattern.en.singularize`` on every token (OPERA swaps in NLTK's
WordNet lemmatiser with POS tags). Neither is available offline without data, so ``singularize`` here
is a small rule-based singulariser with an irregular table that reproduces ``pattern`` on the COCO
vocabulary, nouns only, with ``pattern``'s plain bugs fixed. Where the variants disagree:

* "men"/"women"/"people"/"children" -> man/woman/person/child: all variants agree (person);
* "skiing", "skateboarding", "biking", "seated": left alone as in the ``pattern`` variant, so they are
  NOT mentions of skis/skateboard/bicycle/chair (OPERA's verb lemmatisation would make them so);
* "bus": kept. ``pattern`` turns it into "bu", so the reference never sees a singular "bus" (it only
  counts "buses"); WordNet and we count it. Likewise "-ss" words are kept ("glass", "dress";
  ``pattern`` gives "glas", which is why the reference has a "wine glas" special case) and "tennis";
* "glasses" -> "glass" (all variants); only "wine glass(es)" is an object;
* "skis" -> "ski" (all variants; both are synonyms of ``skis``);
* further ``pattern`` bugs fixed: "ties" -> "tie" (not "ty"), "canoes" -> "canoe" (not "cano"),
  "doggies"/"collies" -> "doggie"/"collie" (``pattern`` leaves them plural).

Two typos of ``synonyms.txt`` are fixed too: a doubled space makes the reference's synonyms
" motor bike" and " cheesecake" (leading space) unmatchable, and "iPhone" can never match lowercased
text; here "motor bike" -> motorcycle, "cheesecake" -> cake and "iphone" -> cell phone. Everything else,
including the list's own quirks ("orange" the colour counts as the fruit, "pitcher" is a person), is
kept so that numbers stay comparable with published ones.

Tokenisation: lower case, words are runs of letters (``nltk.word_tokenize`` in the reference; the
difference only touches punctuation and hyphenated words: "teddy-bear" here is "teddy bear").
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Mapping, Sequence
from functools import lru_cache
from pathlib import Path

from ..jsonl import read_jsonl

# ----------------------------------------------------------------------------------------------- data

# The 80 COCO categories, each line "category, synonym, synonym, ...", after data/synonyms.txt of
# LisaAnne/Hallucination (typos fixed as described in the module docstring; duplicates are harmless).
_SYNONYMS_TXT = """\
person, girl, boy, man, woman, kid, child, chef, baker, people, adult, rider, children, baby, worker, passenger, sister, biker, policeman, cop, officer, lady, cowboy, bride, groom, male, female, guy, traveler, mother, father, gentleman, pitcher, player, skier, snowboarder, skater, skateboarder, person, woman, guy, foreigner, child, gentleman, caller, offender, coworker, trespasser, patient, politician, soldier, grandchild, serviceman, walker, drinker, doctor, bicyclist, thief, buyer, teenager, student, camper, driver, solider, hunter, shopper, villager
bicycle, bike, bicycle, bike, unicycle, minibike, trike
car, automobile, van, minivan, sedan, suv, hatchback, cab, jeep, coupe, taxicab, limo, taxi
motorcycle, scooter, motor bike, motor cycle, motorbike, scooter, moped
airplane, jetliner, plane, air plane, monoplane, aircraft, jet, jetliner, airbus, biplane, seaplane
bus, minibus, trolley
train, locomotive, tramway, caboose
truck, pickup, lorry, hauler, firetruck
boat, ship, liner, sailboat, motorboat, dinghy, powerboat, speedboat, canoe, skiff, yacht, kayak, catamaran, pontoon, houseboat, vessel, rowboat, trawler, ferryboat, watercraft, tugboat, schooner, barge, ferry, sailboard, paddleboat, lifeboat, freighter, steamboat, riverboat, battleship, steamship
traffic light, street light, traffic signal, stop light, streetlight, stoplight
fire hydrant, hydrant
stop sign
parking meter
bench, pew
bird, ostrich, owl, seagull, goose, duck, parakeet, falcon, robin, pelican, waterfowl, heron, hummingbird, mallard, finch, pigeon, sparrow, seabird, osprey, blackbird, fowl, shorebird, woodpecker, egret, chickadee, quail, bluebird, kingfisher, buzzard, willet, gull, swan, bluejay, flamingo, cormorant, parrot, loon, gosling, waterbird, pheasant, rooster, sandpiper, crow, raven, turkey, oriole, cowbird, warbler, magpie, peacock, cockatiel, lorikeet, puffin, vulture, condor, macaw, peafowl, cockatoo, songbird
cat, kitten, feline, tabby
dog, puppy, beagle, pup, chihuahua, schnauzer, dachshund, rottweiler, canine, pitbull, collie, pug, terrier, poodle, labrador, doggie, doberman, mutt, doggy, spaniel, bulldog, sheepdog, weimaraner, corgi, cocker, greyhound, retriever, brindle, hound, whippet, husky
horse, colt, pony, racehorse, stallion, equine, mare, foal, palomino, mustang, clydesdale, bronc, bronco
sheep, lamb, ram, lamb, goat, ewe
cow, cattle, oxen, ox, calf, cattle, holstein, heifer, buffalo, bull, zebu, bison
elephant
bear, panda
zebra
giraffe
backpack, knapsack
umbrella
handbag, wallet, purse, briefcase
tie, bow, bow tie
suitcase, suit case, luggage
frisbee
skis, ski
snowboard
sports ball, ball
kite
baseball bat
baseball glove
skateboard
surfboard, longboard, skimboard, shortboard, wakeboard
tennis racket, racket
bottle
wine glass
cup
fork
knife, pocketknife, knive
spoon
bowl, container
banana
apple
sandwich, burger, sub, cheeseburger, hamburger
orange
broccoli
carrot
hot dog
pizza
donut, doughnut, bagel
cake, cheesecake, cupcake, shortcake, coffeecake, pancake
chair, seat, stool
couch, sofa, recliner, futon, loveseat, settee, chesterfield
potted plant, houseplant
bed
dining table, table, desk
toilet, urinal, commode, toilet, lavatory, potty
tv, monitor, televison, television
laptop, computer, notebook, netbook, lenovo, macbook, laptop computer
mouse
remote
keyboard
cell phone, mobile phone, phone, cellphone, telephone, phon, smartphone, iphone
microwave
oven, stovetop, stove, stove top oven
toaster
sink
refrigerator, fridge, fridge, freezer
book
clock
vase
scissors
teddy bear, teddybear
hair drier, hairdryer
toothbrush
"""


def _parse_synonyms(text: str) -> dict[str, tuple[str, ...]]:
    table: dict[str, tuple[str, ...]] = {}
    for line in text.splitlines():
        words = [w.strip().lower() for w in line.split(",") if w.strip()]
        if words:
            table[words[0]] = tuple(dict.fromkeys(words))  # keep order, drop the list's duplicates
    return table


#: category -> its synonyms (the category name first), 80 entries.
COCO_SYNONYMS: dict[str, tuple[str, ...]] = _parse_synonyms(_SYNONYMS_TXT)
#: any synonym (one or two words, singular) -> its COCO category.
SYNONYM_TO_OBJECT: dict[str, str] = {w: cat for cat, words in COCO_SYNONYMS.items() for w in words}

# Two consecutive (singularised) words that are read as one: the reference's "double words", each
# mapped to itself, then the qualifier rules that map a pair to its second word.
_DOUBLE_WORDS = (
    "motor bike", "motor cycle", "air plane", "traffic light", "street light", "traffic signal",
    "stop light", "fire hydrant", "stop sign", "parking meter", "suit case", "sports ball", "baseball bat",
    "baseball glove", "tennis racket", "wine glass", "hot dog", "cell phone", "mobile phone", "teddy bear",
    "hair drier", "potted plant", "laptop computer", "home plate", "train track",
)
_ANIMAL_WORDS = ("bird", "cat", "dog", "horse", "sheep", "cow", "elephant", "bear", "zebra", "giraffe",
                 "animal", "cub")
#: two-word phrase -> what it is read as (may be a non-object, e.g. "home plate", "train track").
TWO_WORD_PHRASES: dict[str, str] = {
    **{p: p for p in _DOUBLE_WORDS},
    **{f"{q} {a}": a for q in ("baby", "adult") for a in _ANIMAL_WORDS},  # a baby elephant is no person
    "passenger jet": "jet", "passenger train": "train",  # ... and a passenger train no passenger
    "bow tie": "tie",
    "toilet seat": "toilet",
}

# ------------------------------------------------------------------------------------ singularisation

# Exact irregular plurals (and the few -ves / -oes / -ie words the suffix rules below would get wrong).
_IRREGULAR = {
    "people": "person", "children": "child", "mice": "mouse", "lice": "louse", "geese": "goose",
    "teeth": "tooth", "feet": "foot", "oxen": "ox", "cacti": "cactus", "fungi": "fungus", "octopi": "octopus",
    "lives": "life", "elves": "elf", "busses": "bus", "gases": "gas", "lenses": "lens", "quizzes": "quiz",
    "axes": "axe", "toes": "toe", "hoes": "hoe", "oboes": "oboe", "floes": "floe",
}
# Irregular endings that also hold inside compounds: policemen, grandchildren, pocketknives, bookshelves.
_IRREGULAR_SUFFIXES = (
    ("men", "man"), ("children", "child"), ("people", "person"), ("knives", "knife"), ("wives", "wife"),
    ("wolves", "wolf"), ("shelves", "shelf"), ("calves", "calf"), ("halves", "half"), ("leaves", "leaf"),
    ("loaves", "loaf"), ("thieves", "thief"), ("scarves", "scarf"), ("hooves", "hoof"),
    ("shoes", "shoe"), ("canoes", "canoe"),
)
# Singular words ending in "men" (not "-man" plurals).
_NOT_MEN_PLURALS = frozenset({
    "abdomen", "acumen", "albumen", "amen", "bitumen", "hymen", "lumen", "omen", "ramen", "regimen", "semen",
    "specimen", "stamen", "yemen",
})
# Words ending in "s" that are not plurals (or are their own singular), kept as they are.
_INVARIANT = frozenset({
    "as", "is", "us", "was", "has", "does", "his", "its", "this", "yes", "thus", "always", "perhaps", "news",
    "series", "species", "scissors", "means", "physics", "athletics", "gymnastics", "mathematics", "chaos",
    "canvas", "atlas", "alias", "christmas", "texas", "paris", "debris", "chassis", "gas", "lens",
})
# Words ending in "is" that are singular (other "-is" words are plurals of "-i" nouns: skis, taxis, kiwis).
_SINGULAR_IS = frozenset({
    "tennis", "iris", "axis", "pelvis", "penis", "trellis", "mantis", "ibis", "marquis",
})
# Plurals ending in "us" (of nouns ending in "u"); every other "-us" word is singular: bus, cactus, ...
_U_NOUN_PLURALS = frozenset({"menus", "emus", "gnus", "gurus", "tutus", "haikus", "tofus", "bayous", "zebus"})
# Nouns ending in "ie" whose plural must not become "-y" (ties -> tie, not ty; collies -> collie).
_IE_NOUNS = frozenset({
    "tie", "necktie", "bowtie", "pie", "collie", "doggie", "cookie", "movie", "zombie", "brownie", "smoothie",
    "hoodie", "goalie", "birdie", "beanie", "veggie", "selfie", "rookie", "prairie", "calorie", "hippie",
    "pixie", "bootie", "sweetie", "auntie", "rotisserie", "lingerie", "eyrie", "lie",
})
# Nouns ending in "che" (so "-ches" loses only the "s").
_CHE_NOUNS = frozenset({"mustache", "moustache", "headache", "niche", "quiche", "cliche", "cache", "avalanche"})


@lru_cache(maxsize=65536)
def singularize(word: str) -> str:
    """Singular of one lower-case word (nouns; other words come back as they are, or nearly).

    Rules, first match wins: exact irregular table; irregular endings (-men, -children, -knives, ...);
    words not ending in "s" and invariant words unchanged; "-ss", "-us" (bus, cactus) and singular "-is"
    (tennis, iris) unchanged; "-ies" -> "-y" (puppies, ladies) unless an "-ie" noun (ties, collies);
    "-ches"/"-shes"/"-sses"/"-xes"/"-zzes" and "-buses" lose "es" (benches, glasses, boxes, buses);
    "-oes" loses "es" (tomatoes, buffaloes) unless it is a "-oe" noun (shoes, canoes); else drop the "s".
    """
    w = word
    if w in _IRREGULAR:
        return _IRREGULAR[w]
    for plural, singular in _IRREGULAR_SUFFIXES:
        if w.endswith(plural) and not (plural == "men" and w in _NOT_MEN_PLURALS):
            return w[: len(w) - len(plural)] + singular
    if len(w) < 3 or not w.endswith("s") or w in _INVARIANT:
        return w
    if w.endswith(("ss", "sis", "itis")) or w in _SINGULAR_IS:
        return w
    if w.endswith("us") and w not in _U_NOUN_PLURALS:
        return w
    if w.endswith("ies"):
        if w[:-1] in _IE_NOUNS:
            return w[:-1]
        if len(w) > 4 and (w[-4] not in "aeiou" or w[-5:-3] == "qu"):
            return w[:-3] + "y"  # puppies -> puppy, ponies -> pony, ladies -> lady, soliloquies
        return w[:-1]
    if w.endswith("buses"):
        return w[:-2]  # buses, minibuses
    if w.endswith(("ches", "shes", "sses", "xes", "zzes")):
        return w[:-1] if w[:-1] in _CHE_NOUNS else w[:-2]
    if w.endswith("oes"):
        return w[:-2]  # tomatoes, potatoes, buffaloes (the "-oe" nouns are in the tables above)
    return w[:-1]


# ------------------------------------------------------------------------------------ caption -> objects

_WORD_RE = re.compile(r"[^\W\d_]+")


def caption_words(caption: str) -> list[str]:
    """Lower-cased, singularised words of ``caption`` with the two-word phrases merged into one item."""
    words = [singularize(w) for w in _WORD_RE.findall(caption.lower())]
    merged: list[str] = []
    i = 0
    while i < len(words):
        pair = " ".join(words[i : i + 2]) if i + 1 < len(words) else None
        if pair in TWO_WORD_PHRASES:
            merged.append(TWO_WORD_PHRASES[pair])
            i += 2
        else:
            merged.append(words[i])
            i += 1
    return merged


def caption_objects(caption: str) -> tuple[list[str], list[str]]:
    """(mention words, their COCO categories) of ``caption``, in order, one entry per occurrence.

    >>> caption_objects("Two puppies and a hot dog near the men")
    (['puppy', 'hot dog', 'man'], ['dog', 'hot dog', 'person'])
    """
    words = caption_words(caption)
    if "toilet" in words and "seat" in words:  # "the seat of the toilet" is not a chair
        words = [w for w in words if w != "seat"]
    mentions = [w for w in words if w in SYNONYM_TO_OBJECT]
    return mentions, [SYNONYM_TO_OBJECT[w] for w in mentions]


# ------------------------------------------------------------------------------------ ground truth

_YEARS = ("2014", "2017")
_SPLITS = ("train", "val")


def _candidate_dirs(root: Path) -> list[Path]:
    return [root / "annotations", root]


def _find_annotation_files(root: Path) -> list[Path]:
    """The instances + captions files under ``root`` (or ``root/annotations``), 2014 before 2017."""
    if not root.is_dir():
        raise FileNotFoundError(f"COCO annotation directory not found: {root}")
    looked: list[Path] = []
    for year in _YEARS:
        for d in _candidate_dirs(root):
            inst = [d / f"instances_{s}{year}.json" for s in _SPLITS]
            caps = [d / f"captions_{s}{year}.json" for s in _SPLITS]
            looked += inst + caps
            found_inst = [p for p in inst if p.is_file()]
            found_caps = [p for p in caps if p.is_file()]
            if found_inst and found_caps:
                return found_inst + found_caps
            if found_inst or found_caps:
                have, lack = ("instances", "captions") if found_inst else ("captions", "instances")
                raise FileNotFoundError(
                    f"found COCO {have} files in {d} but no {lack} file; looked for "
                    + ", ".join(str(p) for p in (caps if found_inst else inst))
                )
    raise FileNotFoundError(
        f"no COCO annotation files under {root}; looked for " + ", ".join(str(p) for p in looked)
    )


def _load_json(path: Path) -> dict:
    try:
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
    except json.JSONDecodeError as e:
        raise ValueError(f"{path}: not valid JSON ({e})") from e
    if not isinstance(data, dict) or not isinstance(data.get("annotations"), list):
        raise ValueError(f"{path}: not a COCO annotation file (no 'annotations' list)")
    return data


def load_coco_ground_truth(
    coco_dir: str | os.PathLike | Sequence[str | os.PathLike], *, image_ids: Iterable[int] | None = None
) -> dict[int, set[str]]:
    """Ground-truth COCO objects per image id, from local annotation files.

    ``coco_dir`` is a COCO root (with ``annotations/``) or the annotations directory itself, holding
    ``instances_{train,val}2014.json`` and ``captions_{train,val}2014.json`` (2017 names are used when no
    2014 file exists; whichever splits are present are read, at least one of each kind is required), or
    one file / a list of files given directly (instance vs caption files are told apart by content).

    An image's objects are the categories of its instance annotations plus the objects its reference
    captions mention (see ``caption_objects``), as in the reference. Every image listed in a file is a
    key, even with no objects. ``image_ids`` restricts the result (and the caption parsing) to those ids.
    """
    if isinstance(coco_dir, (str, os.PathLike)):
        root = Path(coco_dir)
        if root.is_file():
            files = [root]
        elif root.exists():
            files = _find_annotation_files(root)
        else:
            raise FileNotFoundError(f"COCO annotation directory not found: {root}")
    else:
        files = [Path(p) for p in coco_dir]
        missing = [str(p) for p in files if not p.is_file()]
        if missing or not files:
            raise FileNotFoundError(f"COCO annotation files not found: {missing or '(none given)'}")
    wanted = None if image_ids is None else set(image_ids)

    objects: dict[int, set[str]] = {}

    def keep(imid: int) -> bool:
        return wanted is None or imid in wanted

    for path in files:
        data = _load_json(path)
        for img in data.get("images", []):
            if keep(img["id"]):
                objects.setdefault(img["id"], set())
        anns = data["annotations"]
        if "categories" in data:  # instances file
            names = {c["id"]: c["name"].lower() for c in data["categories"]}
            unknown = sorted(set(names.values()) - set(SYNONYM_TO_OBJECT))
            if unknown:
                raise ValueError(f"{path}: categories that are not COCO's 80: {unknown}")
            for a in anns:
                if keep(a["image_id"]):
                    objects.setdefault(a["image_id"], set()).add(SYNONYM_TO_OBJECT[names[a["category_id"]]])
        elif anns and "caption" in anns[0]:  # captions file
            for a in anns:
                if keep(a["image_id"]):
                    objects.setdefault(a["image_id"], set()).update(caption_objects(a["caption"])[1])
        elif anns:
            raise ValueError(f"{path}: neither an instances file (no 'categories') nor a captions file")
    return objects


# ------------------------------------------------------------------------------------ metric


def coco_chair(captions: Sequence[Mapping], ground_truth: Mapping[int, Iterable[str]]) -> dict:
    """CHAIRs, CHAIRi and recall of ``captions`` (``{"image_id": int, "caption": str}`` each).

    ``ground_truth`` maps image id -> COCO categories (``load_coco_ground_truth``). Every mention
    occurrence counts in CHAIRi (see the module docstring); recall pools distinct objects over captions.
    Returns the three metrics (fractions in [0, 1]), counts, ``mean_length`` (words per caption, before
    phrase merging) and ``per_caption`` records: mention words, their objects, the hallucinated
    ``[word, object]`` pairs, the ground-truth objects and the caption's own chair_s / chair_i / recall.
    Raises ``ValueError`` for an empty list or for image ids that are not in ``ground_truth``.
    """
    if not captions:
        raise ValueError("no captions to evaluate")
    unknown = sorted({c["image_id"] for c in captions} - set(ground_truth), key=lambda i: (str(type(i)), i))
    if unknown:
        shown = ", ".join(map(str, unknown[:20])) + (" ..." if len(unknown) > 20 else "")
        raise ValueError(f"{len(unknown)} image id(s) not in the COCO ground truth: {shown}")

    n_mentions = n_halluc = n_halluc_caps = n_covered = n_gt = n_words = 0
    records = []
    for c in captions:
        text = c["caption"]
        gt = set(ground_truth[c["image_id"]])
        words, objs = caption_objects(text)
        halluc = [[w, o] for w, o in zip(words, objs) if o not in gt]
        covered = set(objs) & gt
        n_mentions += len(objs)
        n_halluc += len(halluc)
        n_halluc_caps += bool(halluc)
        n_covered += len(covered)
        n_gt += len(gt)
        n_words += len(_WORD_RE.findall(text))
        records.append({
            "image_id": c["image_id"],
            "caption": text,
            "mentions": words,
            "objects": objs,
            "hallucinated": halluc,
            "gt_objects": sorted(gt),
            "chair_s": int(bool(halluc)),
            "chair_i": len(halluc) / len(objs) if objs else 0.0,
            "recall": len(covered) / len(gt) if gt else 0.0,
        })
    n = len(captions)
    return {
        "CHAIRs": n_halluc_caps / n,
        "CHAIRi": n_halluc / n_mentions if n_mentions else 0.0,
        "recall": n_covered / n_gt if n_gt else 0.0,
        "n_captions": n,
        "n_mentions": n_mentions,
        "n_hallucinated": n_halluc,
        "n_hallucinated_captions": n_halluc_caps,
        "n_gt_objects": n_gt,
        "n_covered": n_covered,
        "mean_length": n_words / n,
        "per_caption": records,
    }


# ------------------------------------------------------------------------------------ generated captions

_CAPTION_KEYS = ("caption", "text", "answer")


def read_captions_jsonl(path: str | os.PathLike) -> list[dict]:
    """Captions from a JSONL file: one object per line with ``image_id`` (an int, or a string of digits)
    and the caption under ``caption``, ``text`` or ``answer`` (the first present). Blank lines are
    skipped; a malformed line raises ``ValueError`` naming the file and line number."""
    path = Path(path)
    out = []
    for where, rec in read_jsonl(path, "captions"):
        imid = rec.get("image_id")
        if isinstance(imid, str) and imid.strip().isdigit():
            imid = int(imid)
        if not isinstance(imid, int) or isinstance(imid, bool):
            raise ValueError(f"{where}: 'image_id' missing or not an integer: {rec.get('image_id')!r}")
        key = next((k for k in _CAPTION_KEYS if k in rec), None)
        if key is None or not isinstance(rec[key], str):
            raise ValueError(f"{where}: no string caption under any of {list(_CAPTION_KEYS)}")
        out.append({"image_id": imid, "caption": rec[key]})
    if not out:
        raise ValueError(f"{path}: no captions")
    return out
