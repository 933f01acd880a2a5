"""A labelled retrieval set for recall quality: facts an agent would remember about
its users, and questions whose answers are known.

The facts go into the benchmark's scope among its synthetic filler sentences (the
distractors), several of them close to each other on purpose (two sisters, two
flights, two allergies), so that a ranking has to tell them apart. Each query lists
the facts that answer it. Kinds of query:

* ``paraphrase``: the question in other words than the fact (what a vector search
  is for);
* ``exact``: a name, a number or a code that appears verbatim in the fact (what a
  lexical search is for);
* ``mixed``: some words shared with the fact, some not.

``hit@5`` is the share of queries with an answering fact among the top 5 hits;
``MRR`` is the mean of 1 / rank of the first answering fact (0 past the top 5).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

FACTS: dict[str, str] = {
    "sister-lisbon": "Alice's sister Maria moved to Lisbon last spring.",
    "brother-madrid": "Bob's brother Daniel lives in Madrid with his two kids.",
    "peanut": "The user is allergic to peanuts and carries an EpiPen.",
    "shellfish": "Priya cannot eat shellfish; shrimp gives her hives.",
    "vegetarian": "Tom has been vegetarian since 2019 and avoids gelatin.",
    "flight-lh": "Flight LH 1234 to Frankfurt departs at 07:45 on 14 March.",
    "flight-ba": "The return flight is BA 872 from Heathrow on 21 March.",
    "coffee": "She takes her coffee black, no sugar, a double espresso in the morning.",
    "tea": "In the afternoon he prefers green tea over anything with caffeine.",
    "dog": "Their golden retriever is called Biscuit and is nine years old.",
    "cat": "The cat, Miso, needs thyroid medication twice a day.",
    "birthday": "Kenji's birthday is on 3 August; he likes handwritten cards.",
    "anniversary": "The wedding anniversary is 12 June, married in 2011 in Porto.",
    "employer": "Sofia works as a data engineer at Northwind Traders in Oslo.",
    "manager": "Her manager at work is Grace Okafor, who prefers email to Slack.",
    "laptop": "The work laptop is a ThinkPad X1 Carbon with serial PF3K9Z2.",
    "password-policy": "Never store passwords in notes; use the 1Password vault instead.",
    "timezone": "The user is in Pacific Time and does not take calls before 9 am.",
    "language": "Replies should be in Portuguese when the topic is family.",
    "running": "He trains for the Berlin marathon and runs 50 km a week.",
    "knee": "A torn meniscus in the left knee rules out squats and lunges.",
    "piano": "Lena has played piano for twelve years and loves Chopin nocturnes.",
    "book": "Currently reading The Left Hand of Darkness by Ursula K. Le Guin.",
    "car": "The car is a 2017 Volvo V60, plate KX-4471, due for service in May.",
    "apartment": "The apartment on Rua Augusta 88 has a leaking kitchen tap.",
    "budget": "The monthly grocery budget is 600 euros for the household.",
    "insurance": "Health insurance policy number is HX-55-0192 with Allianz.",
    "doctor": "Dr. Ramirez is the family GP; appointments on Tuesdays only.",
    "project": "Project Heron ships its beta on 30 September to 200 pilot users.",
    "deadline": "The grant report for the Wellcome trust is due on 15 November.",
    "meeting": "The weekly sync with the design team is Thursdays at 14:00.",
    "kid-school": "Noah starts first grade at Riverside Elementary this autumn.",
    "kid-allergy": "Noah is allergic to penicillin; amoxicillin caused a rash.",
    "plant": "The fiddle leaf fig by the window needs water every ten days.",
    "wine": "Prefers dry Riesling; dislikes oaked Chardonnay.",
    "hotel": "Booked Hotel Lutetia in Paris for three nights from 2 May.",
    "phone": "Mobile number ends in 4482; WhatsApp is the best way to reach him.",
    "gym": "Gym membership at FitLab renews on the first of each month for 39 euros.",
    "mortgage": "The mortgage rate is fixed at 3.1% until 2029 with ING.",
    "hobby": "Weekends are for bouldering at the climbing hall in Ostbahnhof.",
}


@dataclass(frozen=True, slots=True)
class Query:
    text: str
    answers: tuple[str, ...]
    kind: str  # paraphrase, exact or mixed


def _q(text: str, kind: str, *answers: str) -> Query:
    return Query(text, answers, kind)


QUERIES: tuple[Query, ...] = (
    _q("Where does Alice's sibling live now?", "paraphrase", "sister-lisbon"),
    _q("Which city did Maria relocate to?", "mixed", "sister-lisbon"),
    _q("Daniel", "exact", "brother-madrid"),
    _q("what food allergies should I know about", "paraphrase", "peanut", "shellfish"),
    _q("nut allergy emergency injector", "paraphrase", "peanut"),
    _q("Can Priya have prawns?", "paraphrase", "shellfish"),
    _q("does Tom eat meat", "paraphrase", "vegetarian"),
    _q("LH 1234", "exact", "flight-lh"),
    _q("BA 872", "exact", "flight-ba"),
    _q("when is the flight home", "paraphrase", "flight-ba"),
    _q("what time does the Frankfurt plane leave", "mixed", "flight-lh"),
    _q("how does she like her morning coffee", "mixed", "coffee"),
    _q("favourite hot drink in the afternoon", "paraphrase", "tea"),
    _q("what is the dog's name", "paraphrase", "dog"),
    _q("Biscuit", "exact", "dog"),
    _q("which pet needs pills", "paraphrase", "cat"),
    _q("Miso medication", "exact", "cat"),
    _q("when should I send Kenji a card", "mixed", "birthday"),
    _q("when did they get married", "paraphrase", "anniversary"),
    _q("Where is Sofia employed?", "paraphrase", "employer"),
    _q("Northwind Traders", "exact", "employer"),
    _q("who is her boss", "paraphrase", "manager"),
    _q("Grace Okafor", "exact", "manager"),
    _q("PF3K9Z2", "exact", "laptop"),
    _q("what computer does she use for work", "paraphrase", "laptop"),
    _q("where should passwords be kept", "mixed", "password-policy"),
    _q("what hours can I phone the user", "paraphrase", "timezone"),
    _q("which language to answer in about relatives", "paraphrase", "language"),
    _q("what race is he preparing for", "paraphrase", "running"),
    _q("exercises to avoid because of injury", "paraphrase", "knee"),
    _q("meniscus", "exact", "knee"),
    _q("what instrument does Lena play", "mixed", "piano"),
    _q("Ursula Le Guin", "exact", "book"),
    _q("what novel is the user reading", "paraphrase", "book"),
    _q("KX-4471", "exact", "car"),
    _q("when is the car's next service", "mixed", "car"),
    _q("what needs fixing in the flat", "paraphrase", "apartment"),
    _q("Rua Augusta", "exact", "apartment"),
    _q("how much do we spend on food each month", "paraphrase", "budget"),
    _q("HX-55-0192", "exact", "insurance"),
    _q("who is the family doctor", "mixed", "doctor"),
    _q("Ramirez appointment day", "exact", "doctor"),
    _q("when does Heron launch", "mixed", "project"),
    _q("Wellcome grant report due date", "exact", "deadline"),
    _q("when do we meet the designers", "paraphrase", "meeting"),
    _q("which school will Noah attend", "mixed", "kid-school"),
    _q("antibiotics the child reacts to", "paraphrase", "kid-allergy"),
    _q("penicillin", "exact", "kid-allergy"),
    _q("how often to water the houseplant", "paraphrase", "plant"),
    _q("what wine should I order for her", "paraphrase", "wine"),
    _q("Riesling", "exact", "wine"),
    _q("where are we staying in Paris", "mixed", "hotel"),
    _q("Lutetia", "exact", "hotel"),
    _q("best way to contact him", "paraphrase", "phone"),
    _q("4482", "exact", "phone"),
    _q("how much is the gym", "mixed", "gym"),
    _q("home loan interest", "paraphrase", "mortgage"),
    _q("3.1%", "exact", "mortgage"),
    _q("what does he do on weekends", "mixed", "hobby"),
    _q("rock climbing", "paraphrase", "hobby"),
)


@dataclass(frozen=True, slots=True)
class Quality:
    hit_at_5: float
    mrr: float
    by_kind: dict[str, tuple[float, float]]  # kind -> (hit@5, MRR)


def score(rankings: Sequence[Sequence[str]], queries: Sequence[Query] = QUERIES) -> Quality:
    """hit@5 and MRR@5 of ``rankings`` (the fact labels recalled for each query, best
    first; anything that is not a fact, such as filler, counts as a miss)."""
    per_kind: dict[str, list[float]] = {}
    hits = []
    ranks = []
    for query, ranking in zip(queries, rankings, strict=True):
        rr = 0.0
        for position, label in enumerate(ranking[:5], start=1):
            if label in query.answers:
                rr = 1.0 / position
                break
        hits.append(1.0 if rr else 0.0)
        ranks.append(rr)
        per_kind.setdefault(query.kind, []).append(rr)
    by_kind = {
        kind: (sum(1.0 for r in rrs if r) / len(rrs), sum(rrs) / len(rrs))
        for kind, rrs in per_kind.items()
    }
    return Quality(sum(hits) / len(hits), sum(ranks) / len(ranks), by_kind)
