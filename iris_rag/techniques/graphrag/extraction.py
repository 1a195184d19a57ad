"""Entity and relation extraction for the knowledge graph.

Two extractors produce the same shape (mentions with offsets, relations tied to the text unit that
evidences them):

- RuleExtractor, no LLM: built for scientific and biomedical prose. Abbreviations are tied to their
  expansions by the Schwartz-Hearst algorithm ("tumor necrosis factor (TNF)" makes one entity, and every
  later "TNF" in the document is that entity); gene- and chemical-like tokens (IL-6, BRCA1, p53, TNF-alpha,
  mRNA, CD4+) are entities; multi-word terms are runs of content words between function words, verbs and
  punctuation; capitalised words inside a sentence are names. Entities that share a sentence are related
  (type "co_occurs"), and a relation's weight is how often that happens.
- LlmExtractor: asks the configured OpenAI-compatible server (through iris_rag.llm's one client) for typed
  entities and typed, directed relations in each chunk, and grounds every entity name in the chunk's text
  to get its offsets; any failure of the call or its reply leaves the chunk to RuleExtractor.
"""

from __future__ import annotations

import json
import re
import unicodedata
from collections.abc import Iterable
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError
from rapidfuzz import fuzz

from iris_rag.llm import TechniqueLLM, failure_text
from iris_rag.text import split_sentences

TextField = Literal["title", "content"]

CO_OCCURS = "co_occurs"
MAX_TERM_WORDS = 4
# Relations are drawn between at most this many entities of one sentence (the most specific ones first):
# a long sentence listing 30 terms would otherwise add 435 pairs of little meaning.
MAX_RELATED_PER_SENTENCE = 12

# Lowercase Greek letters (U+03B1 to U+03C9, final sigma included) and their names.
GREEK = dict(
    zip(
        map(chr, range(0x3B1, 0x3CA)),
        (
            "alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu nu xi omicron pi rho sigma "
            "sigma tau upsilon phi chi psi omega"
        ).split(),
        strict=True,
    )
)
_GREEK_NAMES = frozenset(GREEK.values())


def _words(text: str) -> frozenset[str]:
    return frozenset(text.split())


# Function words: they end a term and are never entities.
STOPWORDS = _words(
    """a about above according across after again against al all almost already also although always am
    among an and another any are around as at based be because been before being below between beyond
    both but by can cannot could did do does doing done down due during e.g each either et etc even ever
    every few following for from further had has have having he hence her here hers herself him himself his
    how however i i.e if in including into is it its itself just less like may me might more most much must
    my neither never no nor not of off often on once only onto or other others our ours out over own per
    rather regarding respectively same shall she should since so some such than that the their theirs them
    themselves then there thereby therefore these they this those though through throughout thus to too
    toward towards under unless unlike until up upon us using very via was we well were what whatever when
    whereas whereby wherein whether which while who whom whose why will with within without would yet you
    your versus vs whilst furthermore moreover together additionally nevertheless nonetheless instead
    accordingly consequently indeed namely notably particularly especially specifically subsequently
    previously recently currently finally firstly secondly lastly importantly interestingly surprisingly
    collectively conversely alternatively similarly likewise meanwhile thereafter herein otherwise perhaps
    probably possibly approximately nearly roughly here yes despite later earlier now still where along
    none past prior best january february march april may june july august september october november
    december and/or"""
)

# Section headings of structured abstracts (BACKGROUND, METHODS AND RESULTS, ...): never entities.
HEADINGS = _words(
    """abstract aim aims background conclusion conclusions context design discussion evidence extraction
    findings importance interventions introduction limitations measurements methods objective objectives
    outcomes participants purpose results selection setting settings significance sources summary synthesis
    main"""
)

# Verbs of scientific prose (base forms; -s, -es, -ies and -ing forms are recognised): they end a term.
VERBS = _words(
    """accelerate accompany achieve activate affect aggravate alter ameliorate analyse analyze appear apply
    arise assess associate attenuate augment avoid block cause characterise characterize compare
    compromise conclude confer confirm consist contain contribute correlate decrease demonstrate depend
    describe detect determine develop differ diminish display disrupt drive elevate elicit eliminate emerge
    enable enhance ensure establish estimate evaluate evoke exacerbate examine exceed exert exhibit expand
    explain explore extend facilitate fail find generate give govern hypothesize identify impair implicate
    improve include increase indicate induce influence inhibit initiate interact investigate involve lead
    lower maintain make mediate modulate observe obtain occur offer perform persist play potentiate predict
    prevent produce prolong promote propose protect provide raise recruit reduce reflect regulate remain
    render report represent repress require reveal reverse seem serve show shown stimulate suggest suppress
    sustain tend trigger underlie undergo uncover yield is are was were been being became become becomes
    found known seen taken given made led understood thought brought sought held kept begun grown drawn
    chosen written done discuss result define phosphorylate dephosphorylate acetylate methylate ubiquitinate
    cleave shut switch turn secrete translocate upregulate downregulate silence abolish abrogate catalyze
    catalyse convert localize localise sequester degrade stabilize destabilize counteract antagonize mimic
    restore rescue slow halt kill infect invade migrate proliferate differentiate survive die grow divide
    respond encode transcribe deactivate inactivate sensitize desensitize worsen alleviate relieve treat cure
    boost lessen fall drop double triple bind express interfere combine modify recognize recognise transfer
    fell rise rose risen grew drove bound lost went came saw took gave understand address allow exist
    consider vary receive highlight help elucidate participate"""
)

# Generic words of scientific writing: never an entity alone, and dropped from the start of a term.
COMMON = _words(
    """ability absence activity addition age aim analysis analyses approach area areas aspect assay
    association associations background basis benefit case cases cell cells change changes characteristic
    characteristics cohort component components concentration concentrations condition conditions context
    contrast control controls cost data day days decline decrease degree design development difference
    differences disease diseases dose doses effect effects efficacy evidence example expression extent
    factor factors feature features finding findings follow form function functions gene genes group groups
    hour hours hypothesis impact importance increase individual individuals information interaction
    interactions issue issues level levels manner measure measures mechanism mechanisms method methods
    minute minutes model models month months need number objective observation observations outcome
    outcomes part participant participants pathway pathways patient patients pattern patterns period
    population populations presence process processes property properties protein proteins purpose rate
    rates ratio reason region regions relationship report response responses result results review risk
    role sample samples score scores set setting sex size source stage state status step strategy studies
    study subject subjects system systems technique term terms test time times tissue tissues total
    treatment trial trials type types use value values variable variables way week weeks work year years
    vitro vivo
    significant significantly high higher highest low lower lowest new novel several many various different
    potential important major specific overall previous recent current common similar large larger largest
    small smaller early late further additional possible present primary secondary key main multiple single
    first second third one two three four five six seven eight nine ten certain particular relative
    independent positive negative strong weak greater better worse poor mean median average whole entire
    little less least last next normal general direct indirect related respective available increased
    decreased reduced elevated enhanced impaired altered known used unknown unclear essential consistent
    support insight insights range member members comparison identification combination site sites structure
    structures activation regulation reduction inhibition induction formation production contribution
    improvement understanding target targets loss gain phase molecule molecules signal signals receptor
    receptors amount amounts capacity variety series majority proportion percentage fraction content field
    focus kind order point question questions regard respect scale side subset subsets success tool tools
    trend unit units view detail details frequency addition evaluation assessment measurement approach
    approaches implication implications consequence consequences region basis challenge challenges
    candidate candidates agent agents mode modes class classes line lines step steps able critical
    necessary effective sufficient dependent lack role research knowledge article event difficult useful
    clear half interest crucial dynamic older course date concept effort capable http access absent
    attention fact concern parallel evident lacking comparable unable complete central distinct rapid
    nature responsible relevant adjustment phenomenon management characterization country complex
    follow-up paper history possibility account discovery origin relevance product author advance
    application health clinical act program performance parameter advantage balance biology resource
    technology position limit magnitude center element solution million frequent severe functional
    structural experimental biochemical cellular regulatory prospective controversial dispensable elusive"""
)

# Abbreviations of statistics and reporting: all capitals, but never an entity.
NON_ENTITY_ABBREVIATIONS = _words(
    """CI OR HR RR SD SE SEM IQR AUC ROC NS US UK USA EU II III IV VI VII VIII IX XI XII AM PM vs"""
)


def _non_entity_abbreviation(word: str) -> bool:
    """A statistics or reporting abbreviation, in the singular or plural (CI, CIs, OR, ORs)."""
    return word in NON_ENTITY_ABBREVIATIONS or (
        len(word) > 2 and word.endswith("s") and word[:-1] in NON_ENTITY_ABBREVIATIONS
    )


_UNIT_BASE = "[\u03bc\u00b5u]?[mnpfkc]?(?:g|l|m|mol|M|L|s|Hz|Gy|Da|Pa)"
# A unit alone, or a compound of units (mg/d, nmol/L, cells/\u00b5l, mL/min, kg/m2, mg/m2/wk).
_UNIT_PART = f"(?:{_UNIT_BASE}|micro(?:g|l|L|mol|M)|dl|dL|kDa|IU|U|cells|sec|min|h|hr|d|day|wk|yr|m2)"
_UNIT = re.compile(f"^(?:{_UNIT_BASE}|mmHg|bpm|kDa|ms|min|wk|yr|{_UNIT_PART}(?:/{_UNIT_PART})+)$")
_NUMBER = re.compile("^[\\d.,:/x\u00d7+-]+%?$")
_ROMAN = re.compile(r"^[IVXL]+$")
# A word: letters and digits, joined by inner hyphens, slashes or a dot between digits; "'s" and a trailing
# "+" (CD4+, Ca2+) belong to it.
TOKEN = re.compile(r"[^\W_](?:[^\W_]|[-/](?=[^\W_])|\.(?=\d))*(?:'s\b)?\+*", re.UNICODE)


def transliterate(text: str) -> str:
    """Greek letters spelled out (the symbol alpha becomes "alpha"), after Unicode NFKC normalisation."""
    text = unicodedata.normalize("NFKC", text)
    return "".join(GREEK.get(ch.lower(), ch) if ch.lower() in GREEK else ch for ch in text)


_KEY_PART = re.compile(r"[a-z0-9]+")


_INVARIANT = frozenset("species series diabetes herpes rabies measles mumps scabies caries".split())
# Endings of adjectives: a single word with one of them is not an entity alone (stable, useful, active).
_ADJECTIVE_ENDINGS = ("ble", "ful", "ous", "ive", "ary", "ical", "ular")


def _singular(word: str) -> str:
    if word in _INVARIANT:
        return word
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is", "ous")):
        return word[:-3] + "y" if word.endswith("ies") and len(word) > 4 else word[:-1]
    return word


@lru_cache(maxsize=131072)
def entity_key(text: str) -> str:
    """The normalised identity of an entity name.

    Case, Greek spelling, hyphenation and a plural last word do not matter: "IL-6", "IL6" and "il 6" are
    one key ("il6"), as are TNF-alpha written with the Greek symbol or spelled out, hyphenated or not
    ("tnfalpha"). A part that is a number, a single letter or a Greek letter is glued to the part before it.
    """
    text = transliterate(text).lower().replace("'s ", " ")
    text = re.sub(r"'s$", "", text)
    parts: list[str] = []
    for raw in re.split(r"[\s\-/]+", text):
        for piece in _KEY_PART.findall(raw):
            glue = piece.isdigit() or len(piece) == 1 or piece in _GREEK_NAMES
            if parts and glue:
                parts[-1] += piece
            else:
                parts.append(piece)
    if not parts:
        return ""
    parts[-1] = _singular(parts[-1])
    return " ".join(parts)


GENERIC = COMMON | HEADINGS


def _generic(lower: str) -> bool:
    """A generic word of scientific writing, in the singular or plural."""
    return lower in GENERIC or _singular(lower) in GENERIC


def _is_plain_word(lower: str) -> bool:
    """A word of ordinary prose: a function word, a verb form or a generic word of scientific writing."""
    return lower in STOPWORDS or lower in COMMON or lower in HEADINGS or _lemma_in(lower, VERBS)


def _lemma_in(word: str, vocabulary: frozenset[str]) -> bool:
    """Whether a lowercase word is an inflection of one in the vocabulary (-s, -es, -ies, -ing, -ed)."""
    if word in vocabulary:
        return True
    candidates = []
    if word.endswith("ies"):
        candidates.append(word[:-3] + "y")
    if word.endswith("es"):
        candidates.append(word[:-2])
    if word.endswith("s"):
        candidates.append(word[:-1])
    if word.endswith("ing"):
        candidates += [word[:-3], word[:-3] + "e", word[:-4]]
    if word.endswith("ed"):
        candidates += [word[:-2], word[:-1], word[:-3]]
    return any(c in vocabulary for c in candidates)


@lru_cache(maxsize=131072)
def is_gene_like(word: str) -> bool:
    """A gene-, protein- or chemical-like token: mixed case, letters and digits, Greek letters, capitals."""
    if word.islower() and word.isascii() and word.isalpha():
        return False  # the common case: a plain lowercase word
    bare = word.removesuffix("'s").rstrip("+")
    if len(bare) < 2 or _non_entity_abbreviation(bare) or _ROMAN.match(bare) or _UNIT.match(bare):
        return False
    if bare.isupper() and bare.isalpha() and _is_plain_word(bare.lower()):
        return False  # RESULTS, AND, CONCLUSIONS: headings and shouting, not names
    letters = [c for c in bare if c.isalpha()]
    if not letters:
        return False
    upper = sum(c.isupper() for c in letters)
    has_digit = any(c.isdigit() for c in bare)
    has_greek = any(c.lower() in GREEK for c in bare)
    if bare[0].isdigit():
        # 5-HT, 6-OHDA; not 24h, 10mg or 3-fold.
        return upper >= 2
    if has_greek:
        return len(letters) > 1
    if has_digit:
        # p53, BRCA1, IL-6, COVID-19, H2O2; not a long lowercase word with a number (day7, phase3).
        return upper > 0 or len(letters) <= 3
    if upper >= 2:
        return True
    # mRNA, iPSC, hESC: a capital after a lowercase start.
    return upper >= 1 and not bare[0].isupper()


def display_name(surface: str, sentence_initial: bool) -> str:
    """The name to show: the surface form, with a capital that only starts the sentence undone."""
    first = surface.split(" ", 1)[0]
    if sentence_initial and first[:1].isupper() and first[1:].islower():
        return surface[:1].lower() + surface[1:]
    return surface


@dataclass(frozen=True, slots=True)
class Unit:
    """A piece of a document's text that evidences relations: a sentence (rules) or a chunk (LLM)."""

    field: TextField
    start: int
    end: int


@dataclass(frozen=True, slots=True)
class Mention:
    """One occurrence of an entity: its key, the name as written, its type and where it is."""

    key: str
    name: str
    type: str
    field: TextField
    start: int
    end: int
    unit: int
    # An abbreviation this document does not define: the index may resolve it to an expansion that another
    # document of the collection defines.
    resolvable: bool = False


@dataclass(frozen=True, slots=True)
class Relation:
    """A relation between two entity keys, evidenced by one unit."""

    source: str
    target: str
    type: str
    unit: int


@dataclass
class DocumentGraph:
    """What an extractor found in one document."""

    extractor: str
    units: list[Unit] = field(default_factory=list)
    mentions: list[Mention] = field(default_factory=list)
    relations: list[Relation] = field(default_factory=list)
    # Abbreviations this document defines: short-form key -> long-form key, and the short form as written.
    aliases: dict[str, str] = field(default_factory=dict)
    short_forms: dict[str, str] = field(default_factory=dict)
    note: str | None = None


# Schwartz & Hearst (2003), "A simple algorithm for identifying abbreviation definitions in biomedical text".
def _is_short_form(candidate: str) -> bool:
    words = candidate.split()
    if not 2 <= len(candidate) <= 10 or len(words) > 2 or not candidate[0].isalnum():
        return False
    if not any(c.isalpha() for c in candidate) or _non_entity_abbreviation(candidate):
        return False
    return any(c.isupper() for c in candidate) or any(c.lower() in GREEK for c in candidate)


def _long_form_start(short: str, long: str) -> int | None:
    """Where the long form starts in `long`, matching the short form's characters right to left."""
    s = len(short) - 1
    i = len(long) - 1
    while s >= 0:
        c = short[s].lower()
        if not c.isalnum():
            s -= 1
            continue
        while i >= 0 and (long[i].lower() != c or (s == 0 and i > 0 and long[i - 1].isalnum())):
            i -= 1
        if i < 0:
            return None
        i -= 1
        s -= 1
    return long.rfind(" ", 0, i + 1) + 1


def _match_long_form(short: str, long: str) -> int | None:
    """The long form's start, trying the short form as written and with Greek letters spelled out."""
    start = _long_form_start(short, long)
    if start is None and any(c.lower() in GREEK for c in short):
        start = _long_form_start(transliterate(short), long)
    return start


def find_abbreviations(text: str) -> list[tuple[int, int, int, int]]:
    """(short start, short end, long start, long end) for each definition in one sentence.

    Both "long form (SF)" and "SF (long form)" are recognised. The long form may have at most
    min(|SF| + 5, 2|SF|) words, must be longer than the short form and must not contain it.
    """
    found: list[tuple[int, int, int, int]] = []
    for match in re.finditer(r"\(([^()]{1,80})\)", text):
        inner_start = match.start(1)
        inner = match.group(1)
        head = re.split(r"[;,]", inner, maxsplit=1)[0]
        short = head.strip()
        short_start = inner_start + (len(head) - len(head.lstrip()))
        before = text[: match.start()].rstrip()
        if _is_short_form(short):
            limit = min(len(short) + 5, 2 * len(short))
            words = list(re.finditer(r"\S+", before))[-limit:]
            if not words:
                continue
            window_start = words[0].start()
            window = before[window_start:]
            start = _match_long_form(short, window)
            if start is None:
                continue
            long_start = window_start + start
            long = before[long_start:]
            if _valid_pair(short, long):
                found.append((short_start, short_start + len(short), long_start, long_start + len(long)))
        else:
            previous = re.search(r"(\S+)$", before)
            long = inner.strip()
            if previous is None or not _is_short_form(previous.group(1)) or len(long.split()) < 2:
                continue
            short = previous.group(1)
            start = _match_long_form(short, long)
            long_offset = inner_start + (len(inner) - len(inner.lstrip()))
            if start is not None and _valid_pair(short, long[start:]):
                found.append(
                    (previous.start(1), previous.end(1), long_offset + start, long_offset + len(long))
                )
    return found


def _valid_pair(short: str, long: str) -> bool:
    if len(long) <= len(short) or short.lower() in long.lower() or any(c in long for c in "()[];"):
        return False
    words = long.split()
    return 1 <= len(words) <= min(len(short) + 5, 2 * len(short)) and words[0].lower() not in STOPWORDS


@dataclass(frozen=True, slots=True)
class _Token:
    text: str
    start: int
    end: int
    index: int  # position in the sentence

    @property
    def lower(self) -> str:
        return self.text.lower()


_PRIORITY = {"abbreviation": 0, "gene_or_chemical": 0, "name": 1, "term": 2}


class RuleExtractor:
    """Entities and co-occurrence relations from scientific text, without any model."""

    name = "rules"

    def extract(self, title: str, content: str) -> DocumentGraph:
        """Extract from a document's title and content (each sentence is one unit)."""
        graph = DocumentGraph(self.name)
        sentences: list[tuple[TextField, int, str]] = []
        if title.strip():
            sentences.append(("title", 0, title))
        sentences += [("content", s.start, s.text) for s in split_sentences(content)]
        # Abbreviation definitions first: they hold for the whole document. Kept per unit: looked up per
        # sentence, a flat list would make extraction quadratic in the document's length.
        definitions: dict[int, list[Mention]] = {}
        for unit, (text_field, offset, text) in enumerate(sentences):
            for short_start, short_end, long_start, long_end in find_abbreviations(text):
                long = text[long_start:long_end]
                short = text[short_start:short_end]
                long_key, short_key = entity_key(long), entity_key(short)
                if not long_key or not short_key or long_key == short_key:
                    continue
                graph.aliases.setdefault(short_key, long_key)
                graph.short_forms.setdefault(short_key, short)
                name = display_name(long, long_start == 0)
                definitions.setdefault(unit, []).extend(
                    (
                        Mention(
                            long_key, name, "term", text_field, offset + long_start, offset + long_end, unit
                        ),
                        Mention(
                            long_key,
                            short,
                            "abbreviation",
                            text_field,
                            offset + short_start,
                            offset + short_end,
                            unit,
                        ),
                    )
                )
        for unit, (text_field, offset, text) in enumerate(sentences):
            graph.units.append(Unit(text_field, offset, offset + len(text)))
            mentions = self._sentence_mentions(text, text_field, offset, unit, graph.aliases)
            mentions += definitions.get(unit, [])
            mentions = _dedupe(mentions)
            graph.mentions += mentions
            graph.relations += _co_occurrences(mentions, unit)
        return graph

    def _sentence_mentions(
        self, text: str, text_field: TextField, offset: int, unit: int, aliases: dict[str, str]
    ) -> list[Mention]:
        tokens = [_Token(m.group(), m.start(), m.end(), i) for i, m in enumerate(TOKEN.finditer(text))]
        mentions: list[Mention] = []
        run: list[_Token] = []

        def close() -> None:
            if run:
                mentions.extend(self._run_mentions(list(run), text, text_field, offset, unit))
                run.clear()

        previous_end: int | None = None
        for token in tokens:
            if previous_end is not None and text[previous_end : token.start].strip():
                close()  # punctuation between the words
            previous_end = token.end
            head = _gene_like_head(token.text)
            if head is not None:
                mentions.append(self._token_mention(head, token, text_field, offset, unit, aliases))
                run.append(token)
                continue
            if is_gene_like(token.text):
                surface = token.text.removesuffix("'s")
                mentions.append(self._token_mention(surface, token, text_field, offset, unit, aliases))
                run.append(token)
                continue
            if self._ends_term(token):
                close()
                continue
            run.append(token)
        close()
        return mentions

    @staticmethod
    def _token_mention(
        surface: str, token: _Token, text_field: TextField, offset: int, unit: int, aliases: dict[str, str]
    ) -> Mention:
        key = entity_key(surface)
        resolved = aliases.get(key)
        kind = "gene_or_chemical" if _has_digit_or_mixed(surface) else "abbreviation"
        return Mention(
            resolved or key,
            surface,
            "abbreviation" if resolved else kind,
            text_field,
            offset + token.start,
            offset + token.start + len(surface),
            unit,
            resolvable=resolved is None,
        )

    @staticmethod
    def _ends_term(token: _Token) -> bool:
        word = token.text
        lower = token.lower.removesuffix("'s")
        if _NUMBER.match(word) or lower in STOPWORDS or _UNIT.match(word):
            return True
        if len(lower) < 2 or _non_entity_abbreviation(word):
            return True
        capitalised_inside = word[:1].isupper() and token.index > 0
        if capitalised_inside:
            return False
        if _lemma_in(lower, VERBS):
            return True
        # Adverbs, participles and verbs by their ending (significantly, treated, stabilizes, amplifies).
        return (len(lower) > 3 and lower.endswith(("ly", "ed"))) or (
            len(lower) > 6 and lower.endswith(("izes", "ises", "ifies"))
        )

    @staticmethod
    def _run_mentions(
        run: list[_Token], text: str, text_field: TextField, offset: int, unit: int
    ) -> list[Mention]:
        """The term a run of content words makes (gene-like words in it were emitted already)."""

        def generic(token: _Token) -> bool:
            return _generic(token.lower) and not is_gene_like(token.text)

        while run and generic(run[0]):
            run.pop(0)
        if len(run) > MAX_TERM_WORDS:
            run = run[-MAX_TERM_WORDS:]
            while run and generic(run[0]):
                run.pop(0)
        if not run or all(generic(t) for t in run):
            return []
        if len(run) == 1:
            token = run[0]
            if is_gene_like(token.text):
                return []
            lower = token.lower.removesuffix("'s")
            name_like = _title_case_inside(token)
            if len(lower) < (3 if name_like else 4) or _generic(lower):
                return []
            if not name_like and lower.endswith(_ADJECTIVE_ENDINGS):
                return []
            kind = "name" if name_like else "term"
        else:
            kind = "name" if any(_title_case_inside(t) for t in run) else "term"
        start, end = run[0].start, run[-1].end
        surface = text[start:end]
        if surface.endswith("'s"):
            surface, end = surface[:-2], end - 2
        key = entity_key(surface)
        if not key or (len(run) == 1 and len(key) < 3):
            return []
        name = display_name(surface, run[0].index == 0)
        return [Mention(key, name, kind, text_field, offset + start, offset + end, unit)]


def _title_case_inside(token: _Token) -> bool:
    """A capitalised word (not gene-like) that does not start its sentence: part of a name."""
    return token.index > 0 and token.text[:1].isupper() and not is_gene_like(token.text)


def _gene_like_head(word: str) -> str | None:
    """The gene-like part of "TNF-induced", "IL-6-mediated" or "p53-dependent" (a lowercase word after it)."""
    head, _, tail = word.removesuffix("'s").rpartition("-")
    if head and len(tail) >= 4 and tail.isalpha() and tail.islower() and is_gene_like(head):
        return head
    return None


def _has_digit_or_mixed(word: str) -> bool:
    bare = word.removesuffix("'s").rstrip("+")
    letters = [c for c in bare if c.isalpha()]
    return (
        any(c.isdigit() for c in bare)
        or any(c.lower() in GREEK for c in bare)
        or (any(c.isupper() for c in letters) and any(c.islower() for c in letters))
    )


def _dedupe(mentions: list[Mention]) -> list[Mention]:
    """One mention per span; a span that is an abbreviation's definition wins over a plain term."""
    best: dict[tuple[int, int, str], Mention] = {}
    for mention in mentions:
        slot = (mention.start, mention.end, mention.field)
        current = best.get(slot)
        if current is None or _PRIORITY.get(mention.type, 3) < _PRIORITY.get(current.type, 3):
            best[slot] = mention
    return sorted(best.values(), key=lambda m: (m.start, -m.end))


def _co_occurrences(mentions: list[Mention], unit: int) -> list[Relation]:
    """A co_occurs relation for each pair of different entities in the sentence whose spans do not overlap."""
    first: dict[str, Mention] = {}
    for mention in sorted(mentions, key=lambda m: (_PRIORITY.get(m.type, 3), m.start)):
        first.setdefault(mention.key, mention)
    chosen = list(first.values())[:MAX_RELATED_PER_SENTENCE]
    spans = {key: [(m.start, m.end) for m in mentions if m.key == key] for key in first}
    relations: list[Relation] = []
    for i, a in enumerate(chosen):
        for b in chosen[i + 1 :]:
            if _only_overlapping(spans[a.key], spans[b.key]):
                continue
            source, target = sorted((a.key, b.key))
            relations.append(Relation(source, target, CO_OCCURS, unit))
    return relations


def _only_overlapping(a: list[tuple[int, int]], b: list[tuple[int, int]]) -> bool:
    """Whether every occurrence of one entity overlaps one of the other (a term and a word inside it)."""
    return all(any(s < e2 and s2 < e for s2, e2 in b) for s, e in a)


# LLM extraction
EXTRACTION_MAX_TOKENS = 1024


class ExtractionFailedError(Exception):
    """The LLM's extraction could not be used (request failed or the reply was not the JSON asked for)."""


EXTRACTION_PROMPT = (
    "You extract a knowledge graph from scientific text. Reply with one JSON object and nothing else:\n"
    '{"entities": [{"name": "...", "type": "..."}], '
    '"relations": [{"source": "...", "target": "...", "type": "..."}]}\n'
    "Entities are the specific things the text is about (genes, proteins, chemicals, drugs, diseases, "
    "cell types, organisms, methods, named people or places); write each name exactly as it appears in "
    "the text, and give a short lowercase type (gene, protein, chemical, drug, disease, cell_type, ...). "
    "Relations connect two of those entities with a short lowercase verb type (activates, inhibits, "
    "causes, treats, binds, increases, decreases, associated_with, ...), source first. Only include what "
    "the text states."
)


class _LlmEntity(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str = Field(min_length=1, max_length=200)
    type: str = "entity"


class _LlmRelation(BaseModel):
    model_config = ConfigDict(extra="ignore")

    source: str = Field(min_length=1, max_length=200)
    target: str = Field(min_length=1, max_length=200)
    type: str = "related_to"


class _LlmGraph(BaseModel):
    model_config = ConfigDict(extra="ignore")

    entities: list[_LlmEntity] = Field(default_factory=list)
    relations: list[_LlmRelation] = Field(default_factory=list)


def parse_llm_graph(reply: str) -> _LlmGraph:
    """The JSON object in an LLM reply (code fences and text around it are tolerated)."""
    start, end = reply.find("{"), reply.rfind("}")
    if start < 0 or end <= start:
        msg = f"the LLM reply holds no JSON object: {reply[:200]!r}"
        raise ExtractionFailedError(msg)
    try:
        return _LlmGraph.model_validate(json.loads(reply[start : end + 1]))
    except (json.JSONDecodeError, ValidationError) as exc:
        msg = f"the LLM reply is not the graph JSON asked for: {exc}"
        raise ExtractionFailedError(msg) from exc


def _type_name(value: str, default: str) -> str:
    name = re.sub(r"[^a-z0-9]+", "_", value.strip().lower()).strip("_")[:40]
    return name or default


def ground(name: str, text: str) -> list[tuple[int, int]]:
    """Where a name occurs in the text: each exact (case-insensitive) match, else the best fuzzy one."""
    spans = [
        (m.start(), m.end())
        for m in re.finditer(r"(?<!\w)" + re.escape(name.strip()) + r"(?!\w)", text, re.IGNORECASE)
    ]
    if spans or len(name.strip()) < 3:
        return spans
    alignment = fuzz.partial_ratio_alignment(name.strip().lower(), text.lower(), score_cutoff=90)
    if alignment is None or alignment.dest_end <= alignment.dest_start:
        return []
    return [(alignment.dest_start, alignment.dest_end)]


class LlmExtractor:
    """Typed entities and typed, directed relations per chunk, from the configured LLM."""

    name = "llm"

    def __init__(self, llm: TechniqueLLM) -> None:
        self.llm = llm

    @property
    def model_name(self) -> str:
        """The chat model that extracts."""
        return self.llm.model_name or ""

    def _reply(self, user: str) -> str:
        """The LLM's reply; ExtractionFailedError on any failure, so the rules extract instead."""
        try:
            return self.llm.complete(EXTRACTION_PROMPT, user, max_tokens=EXTRACTION_MAX_TOKENS)
        except Exception as exc:
            raise ExtractionFailedError(failure_text(exc, self.llm.secrets)) from exc

    def extract_chunks(self, title: str, chunks: Iterable[tuple[int, int, str]]) -> DocumentGraph:
        """Extract from each (start, end, text) chunk of a document's content; each chunk is one unit."""
        graph = DocumentGraph(self.name)
        for start, end, text in chunks:
            unit = len(graph.units)
            graph.units.append(Unit("content", start, end))
            header = f"Title: {title}\n\n" if title else ""
            parsed = parse_llm_graph(self._reply(f"{header}Text:\n{text}"))
            keys: dict[str, str] = {}
            for entity in parsed.entities:
                key = entity_key(entity.name)
                spans = ground(entity.name, text) if key else []
                if not spans:
                    continue
                keys[entity.name.strip().lower()] = key
                graph.mentions += [
                    Mention(
                        key,
                        entity.name.strip(),
                        _type_name(entity.type, "entity"),
                        "content",
                        start + s,
                        start + e,
                        unit,
                    )
                    for s, e in spans
                ]
            for relation in parsed.relations:
                source = keys.get(relation.source.strip().lower())
                target = keys.get(relation.target.strip().lower())
                if source and target and source != target:
                    graph.relations.append(
                        Relation(source, target, _type_name(relation.type, "related_to"), unit)
                    )
        return graph


def as_json(graph: DocumentGraph) -> dict[str, Any]:
    """A plain view of an extraction (for logs and tests)."""
    return {
        "extractor": graph.extractor,
        "entities": sorted({m.key for m in graph.mentions}),
        "relations": sorted({(r.source, r.target, r.type) for r in graph.relations}),
        "aliases": graph.aliases,
    }
