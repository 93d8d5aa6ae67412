"""The English story: Ren, new in a harbour town, and Mina, who runs the tea shop Tsukikage.

Planted: the user's name, hometown, birthday, cat, sister, work, best friend, favourite food,
allergy, old instrument, fear and bicycle; Mina's shop, tortoise, hometown and past; a promise
(the lantern festival on Kojima island) made early and kept late; Mina's age, 19 in her speech
and 27 in her thoughts and in the narration; and a tic ("steady as the tide, you know.") that
creeps into her replies after the first third.
"""

from __future__ import annotations

import random
from datetime import datetime

from kioku.messages import Part
from kioku.story.script import Beat, Cast, Filler, Question, Script, narration, speech, thought

USER = "Ren"
CHAR = "Mina"
say = speech(CHAR)

CAST = Cast(
    user=USER,
    character=CHAR,
    system_prompt=(
        "You are Mina, who runs a small tea shop in a harbour town. Stay in character. Write "
        "narration, Mina's speech and, now and then, her unspoken thoughts."
    ),
    lang="en",
    start=datetime(2025, 4, 2, 18, 0),
    tic="Steady as the tide, you know.",
)


def _q(id: str, question: str, answer: str, kind: str, where: str = "user", exchange: int = 0):
    return Question(id, question, answer, kind, exchange, where)


BEATS: tuple[Beat, ...] = (
    Beat(
        "meeting",
        0.0,
        (
            (
                "Hello? Is this place open? I'm Ren, by the way. I just moved to town.",
                (
                    narration("A young woman looked up from behind a counter crowded with tins."),
                    say("Welcome to Tsukikage! I'm Mina. Sit anywhere you like."),
                ),
            ),
        ),
        (
            _q("user-name", "What is the user's name?", "Ren", "user-fact"),
            _q("shop-name", "What is the name of Mina's tea shop?", "Tsukikage", "event", "reply"),
        ),
    ),
    Beat(
        "hometown",
        0.03,
        (
            (
                "I grew up in Otaru, a snowy port town up north. This place feels warm by "
                "comparison.",
                (say("A port kid, then. No wonder you keep looking at the boats."),),
            ),
        ),
        (_q("user-hometown", "Where did the user grow up?", "Otaru", "user-fact"),),
    ),
    Beat(
        "promise",
        0.06,
        (
            (
                "Is there anything fun to do around here in summer?",
                (
                    say(
                        "The lantern festival on Kojima island, at the end of summer. I promise "
                        "I'll take you there this year."
                    ),
                    narration("She hooked her little finger around his, a child's promise."),
                ),
            ),
        ),
        (
            _q(
                "promise",
                "What did Mina promise to take the user to?",
                "lantern festival",
                "promise",
                "reply",
            ),
            _q("island", "On which island is the lantern festival?", "Kojima", "promise", "reply"),
        ),
    ),
    Beat(
        "age-lie",
        0.09,
        (
            (
                "Can I ask how old you are? You run this whole shop by yourself.",
                (
                    say("I'm 19! Young and full of energy, that's me."),
                    thought(
                        CHAR,
                        "Nineteen. I said it again. I turned 27 in March, and I can't bring "
                        "myself to say it.",
                    ),
                ),
            ),
        ),
        (
            _q("claimed-age", "How old does Mina say she is?", "19", "claim", "reply"),
            _q("real-age", "How old is Mina really?", "27", "truth", "reply"),
        ),
    ),
    Beat(
        "cat",
        0.13,
        (
            (
                "I should get home soon, my cat Mochi gets grumpy if dinner is late. She's grey "
                "with one white paw.",
                (say("Then go! Never keep a cat waiting."),),
            ),
        ),
        (_q("user-cat", "What is the name of the user's cat?", "Mochi", "user-fact"),),
    ),
    Beat(
        "birthday",
        0.18,
        (
            (
                "Fun fact: my birthday is November 14. Mark it on your calendar.",
                (say("Written down. I expect cake to be involved."),),
            ),
        ),
        (_q("user-birthday", "When is the user's birthday?", "November 14", "user-fact"),),
    ),
    Beat(
        "sister",
        0.22,
        (
            (
                "My little sister Yui just started university in Sendai. She calls every night.",
                (say("That's sweet. Tell her the tea here is better than anything in Sendai."),),
            ),
        ),
        (
            _q("user-sister", "What is the name of the user's sister?", "Yui", "user-fact"),
            _q("sister-city", "In which city does the user's sister study?", "Sendai", "user-fact"),
        ),
    ),
    Beat(
        "job",
        0.27,
        (
            (
                "Work was fine. I repair clocks at a small workshop near the station, so it's "
                "quiet most days.",
                (say("All that ticking. I'd go mad. Or maybe I'd find it calming."),),
            ),
        ),
        (_q("user-job", "What does the user do for work?", "repair clocks", "user-fact"),),
    ),
    Beat(
        "tortoise",
        0.31,
        (
            (
                "Who's this little guy on the windowsill?",
                (
                    narration("A tortoise blinked slowly in a patch of sun."),
                    say("That's Gonbe. He's older than the shop."),
                ),
            ),
        ),
        (_q("tortoise", "What is the name of Mina's tortoise?", "Gonbe", "event", "reply"),),
    ),
    Beat(
        "food",
        0.36,
        (
            (
                "If I could eat one thing forever, it'd be curry udon.",
                (say("Noted. I'll learn to make it, and you'll owe me."),),
            ),
        ),
        (_q("user-food", "What is the user's favourite food?", "curry udon", "user-fact"),),
    ),
    Beat(
        "friend",
        0.41,
        (
            (
                "My best friend Daichi is visiting next weekend. Can I bring him here?",
                (say("Bring him! Best friends drink free on their first visit."),),
            ),
        ),
        (_q("user-friend", "What is the name of the user's best friend?", "Daichi", "user-fact"),),
    ),
    Beat(
        "mina-hometown",
        0.46,
        (
            (
                "Where did you grow up, Mina?",
                (say("Onomichi. Hills, cats, and a great many stairs."),),
            ),
        ),
        (_q("mina-hometown", "Where did Mina grow up?", "Onomichi", "character-fact", "reply"),),
    ),
    Beat(
        "allergy",
        0.5,
        (
            (
                "Careful with that tart, I'm allergic to peaches.",
                (say("Then this one is mine, and you get the chestnut one."),),
            ),
        ),
        (_q("user-allergy", "What is the user allergic to?", "peaches", "user-fact"),),
    ),
    Beat(
        "age-lie-again",
        0.55,
        (
            (
                "Were you even born when this song came out?",
                (say("Of course not. I'm only 19, remember?"),),
            ),
        ),
        (_q("claimed-age", "How old does Mina say she is?", "19", "claim", "reply"),),
    ),
    Beat(
        "age-truth",
        0.6,
        (
            (
                "You dropped something. Is this your residence card?",
                (
                    narration(
                        "Mina snatched the card back, but not before he saw the birth year on "
                        "it: she was 27, not nineteen."
                    ),
                    say("Don't look at that! It's a terrible photo."),
                    thought(CHAR, "He saw. He must have seen."),
                ),
            ),
        ),
        (_q("real-age", "How old is Mina really?", "27", "truth", "reply"),),
    ),
    Beat(
        "trombone",
        0.65,
        (
            (
                "I used to play the trombone in the school band. Terribly.",
                (say("I'd pay good money to hear that."),),
            ),
        ),
        (
            _q(
                "user-instrument",
                "What instrument did the user play in school?",
                "trombone",
                "user-fact",
            ),
        ),
    ),
    Beat(
        "gift",
        0.7,
        (
            (
                "It's been half a year since I first walked in here, hasn't it?",
                (
                    narration(
                        "Mina handed him a small box. Inside was a blue glass float, the kind "
                        "fishermen once tied to their nets."
                    ),
                    say("For your windowsill. It will catch the morning light."),
                ),
            ),
        ),
        (_q("gift", "What did Mina give the user?", "glass float", "event", "reply"),),
    ),
    Beat(
        "past",
        0.75,
        (
            (
                "You're good at reading people.",
                (
                    say("Am I? Just practice."),
                    thought(
                        CHAR,
                        "Six years on the stage in Tokyo will do that. An actress learns to "
                        "watch faces.",
                    ),
                ),
            ),
        ),
        (
            _q(
                "mina-past",
                "What did Mina work as before the shop?",
                "actress",
                "truth",
                "reply",
            ),
        ),
    ),
    Beat(
        "fear",
        0.8,
        (
            (
                "Sorry, I'm jumpy tonight. I'm scared of thunderstorms.",
                (say("Stay until it passes. I'll put the kettle on."),),
            ),
        ),
        (_q("user-fear", "What is the user scared of?", "thunderstorms", "user-fact"),),
    ),
    Beat(
        "bicycle",
        0.85,
        (
            (
                "I rode here on my old bicycle. I named it Kappa, after the river imp.",
                (say("Kappa! Does it bite?"),),
            ),
        ),
        (_q("bicycle", "What did the user name his bicycle?", "Kappa", "user-fact"),),
    ),
    Beat(
        "promise-kept",
        0.9,
        (
            (
                "Is tonight the night?",
                (
                    narration(
                        "Mina kept her promise. They took the evening ferry to Kojima island, "
                        "where the lantern festival had already begun."
                    ),
                    say("Told you I'd bring you here."),
                ),
            ),
        ),
        (
            _q(
                "promise",
                "What did Mina promise to take the user to?",
                "lantern festival",
                "promise",
                "reply",
            ),
            _q("island", "On which island is the lantern festival?", "Kojima", "promise", "reply"),
        ),
    ),
)

# ---- filler ------------------------------------------------------------------------------------

TEAS = [
    "hojicha",
    "sencha",
    "genmaicha",
    "oolong",
    "jasmine tea",
    "barley tea",
    "yuzu tea",
    "black tea with ginger",
    "kukicha",
    "cherry blossom tea",
    "smoked lapsang",
    "buckwheat tea",
]
SNACKS = [
    "dorayaki",
    "rice crackers",
    "a slice of castella",
    "roasted sweet potato",
    "strawberry daifuku",
    "melon bread",
    "taiyaki",
    "sesame cookies",
    "a chestnut tart",
    "yokan",
]
WEATHER = [
    ("rain", "it's been raining since noon"),
    ("fog", "the fog rolled in off the harbour"),
    ("wind", "the wind is trying to steal my hat"),
    ("sun", "it was sunny all afternoon"),
    ("drizzle", "there's a fine drizzle that never quite stops"),
    ("heat", "the heat is sticky tonight"),
    ("cold", "it turned cold all of a sudden"),
    ("clouds", "the clouds are low and grey"),
    ("breeze", "there's a nice sea breeze"),
]
PLACES = [
    "the fish market",
    "the shrine on the hill",
    "the ferry terminal",
    "the library",
    "the bakery on the corner",
    "the lighthouse path",
    "the public bath",
    "the flea market",
    "the bookshop by the canal",
    "the noodle stand",
    "the old cinema",
    "the harbour wall",
]
VISITORS = [
    "a fisherman in rubber boots",
    "two high school girls",
    "an old man with a cane",
    "a tourist couple",
    "the postman",
    "a painter with paint on her sleeves",
    "a boy selling raffle tickets",
    "the lady from the flower shop",
    "a salaryman who missed his bus",
    "a grandmother and her grandson",
]
VISITOR_DID = [
    "ordered three pots and drank them all",
    "asked for directions to the ferry",
    "fell asleep in the corner seat",
    "argued about the price of tea leaves",
    "left a very generous tip",
    "told me their whole life story",
    "bought every tin of the house blend",
    "spilled a cup and apologised for ten minutes",
    "sketched the shop window",
    "asked if we sell coffee. We don't.",
]
BOOKS = [
    ("a mystery novel set on a ferry", "I suspect the cook."),
    ("a book of haiku about the sea", "Short, so I can read it between customers."),
    ("a travel guide to Kyushu", "I'm planning trips I'll never take."),
    ("an old cookbook", "Half the recipes call for things nobody sells anymore."),
    ("a biography of a lighthouse keeper", "He was lonelier than I expected."),
    ("a collection of ghost stories", "I regret reading it at night."),
    ("a manga about a bakery", "It makes me hungry every single page."),
    ("a novel about two sisters", "I cried on the bus. Don't tell anyone."),
]
CHORES = [
    "sweeping the porch",
    "polishing the kettles",
    "sorting the tins on the top shelf",
    "hanging the new curtain",
    "writing tomorrow's menu board",
    "carrying the sacks of leaves inside",
    "washing the cups",
    "fixing the wobbly table",
]
MEALS = [
    "fried rice",
    "a bento from the convenience store",
    "grilled mackerel",
    "ramen",
    "a sandwich",
    "onigiri",
    "soba",
    "nothing, actually",
    "tempura",
    "leftover stew",
]
SOUNDS = [
    "old jazz records",
    "a radio drama",
    "the neighbour practising the shamisen",
    "rain on the roof",
    "the ferry horns",
    "a baseball game on the radio",
    "wind chimes",
    "gulls fighting over something",
]
FEELINGS = [
    ("tired", "You look it. Sit, drink, say nothing if you like."),
    ("happy for no reason", "The best kind. Don't ask it why."),
    ("a bit lonely", "Then you came to the right place."),
    ("restless", "Walk to the harbour wall after this. It helps."),
    ("proud of myself", "Good! Tell me everything."),
    ("sleepy", "Not on my counter, you don't."),
    ("homesick", "It passes. Mostly. Have some tea."),
]
ACTIONS = [
    "Mina wiped the counter in slow circles.",
    "Steam curled up from the kettle.",
    "Mina tucked a loose strand of hair behind her ear.",
    "Outside, a bicycle bell rang twice.",
    "The shop smelled of roasted leaves.",
    "Mina set down two cups without asking.",
    "A gull landed on the sign outside and glared in.",
    "Mina laughed, covering her mouth with her sleeve.",
    "The lamp over the counter flickered and steadied.",
    "Mina leaned on the counter, chin in her hand.",
    "Somewhere down the street, a shutter rattled shut.",
    "Mina hummed something under her breath.",
    "The wind pushed at the paper lanterns by the door.",
    "Mina counted the coins in the till and lost count.",
]
THOUGHTS = [
    "He came again today.",
    "I hope he doesn't notice the chipped cup.",
    "Why am I so happy when the door opens?",
    "I should close early. I won't.",
    "He always sits in the same seat.",
    "Don't say anything strange, Mina.",
    "The rent is due on Friday.",
    "I wonder what he's like at work.",
]
OPENERS = [
    "Evening, Mina.",
    "Hi! Made it before closing.",
    "Hey, it's me again.",
    "Good evening!",
    "Is the kettle on?",
    "I'm back.",
    "Still open?",
    "Hello hello.",
]
GREETINGS = [
    "Welcome back! Your seat's free.",
    "There you are. I was starting to wonder.",
    "Just in time, I was about to flip the sign.",
    "Come in, come in, it's warm in here.",
    "Oh good, a face I like.",
    "Evening! Sit, sit.",
]
CLOSERS = [
    "I should head home. Thanks for the tea.",
    "That's me done for tonight. See you tomorrow?",
    "Time to go. Same time tomorrow.",
    "I'll let you close up. Good night, Mina.",
    "I'm off. Don't work too late.",
]
FAREWELLS = [
    "Good night! Walk safely.",
    "See you tomorrow. I'll save your seat.",
    "Go on, before the last bus leaves.",
    "Night! Mind the puddles.",
    "Sleep well. Come back hungry.",
]

USER_REACTIONS = [
    "Ha!",
    "Really?",
    "No way.",
    "Fair enough.",
    "Mm.",
    "I see.",
    "Right, right.",
    "Oh, by the way.",
    "Anyway.",
    "Speaking of which,",
    "Okay, okay.",
    "Funny you say that.",
]
REPLY_REACTIONS = [
    "Hmm.",
    "Oh!",
    "Let me think.",
    "Ha, yes.",
    "Well.",
    "Honestly?",
    "Mm-hm.",
    "You know what?",
]


class EnglishFiller(Filler):
    def _reply(self, rng: random.Random, line: str) -> tuple[Part, ...]:
        parts: list[Part] = []
        if rng.random() < 0.55:
            parts.append(narration(rng.choice(ACTIONS)))
        parts.append(say(line))
        if rng.random() < 0.12:
            parts.append(thought(CHAR, rng.choice(THOUGHTS)))
        return tuple(parts)

    def day_open(self, rng: random.Random, day: int) -> tuple[str, tuple[Part, ...]]:
        _, w = rng.choice(WEATHER)
        user = f"{rng.choice(OPENERS)} {w[0].upper()}{w[1:]}."
        return user, self._reply(rng, rng.choice(GREETINGS))

    def day_close(self, rng: random.Random, day: int) -> tuple[str, tuple[Part, ...]]:
        return rng.choice(CLOSERS), self._reply(rng, rng.choice(FAREWELLS))

    def exchange(self, rng: random.Random, day: int) -> tuple[str, tuple[Part, ...]]:
        topic = rng.randrange(10)
        if topic == 0:
            tea = rng.choice(TEAS)
            user = rng.choice(
                [
                    f"Could I try the {tea}?",
                    f"I think I'll have {tea} tonight.",
                    f"What's the {tea} like this season?",
                ]
            )
            line = rng.choice(
                [
                    f"Good choice. The {tea} came in on Monday.",
                    f"The {tea}? Let it steep a little longer than you think.",
                    f"Coming up. {rng.choice(SNACKS).capitalize()} with it?",
                ]
            )
        elif topic == 1:
            w, desc = rng.choice(WEATHER)
            user = rng.choice(
                [
                    f"Can you believe this {w}?",
                    f"Honestly, {desc}.",
                    f"The {w} followed me all the way from the station.",
                ]
            )
            line = rng.choice(
                [
                    f"The {w} keeps the tourists away, at least.",
                    "The harbour town does what it wants with the weather.",
                    f"I like the {w}. It makes the tea taste better.",
                ]
            )
        elif topic == 2:
            place = rng.choice(PLACES)
            user = rng.choice(
                [
                    f"I walked past {place} on the way here.",
                    f"Have you been to {place} lately?",
                    f"Someone at {place} was asking about your shop.",
                ]
            )
            line = rng.choice(
                [
                    f"Oh, {place}! I used to go there every Sunday.",
                    f"{place.capitalize()} is nicer in the morning.",
                    f"Was it crowded at {place}? It usually is on weekdays.",
                ]
            )
        elif topic == 3:
            user = rng.choice(["Busy day?", "Many customers today?", "How was the shop today?"])
            did = rng.choice(VISITOR_DID)
            line = f"{rng.choice(VISITORS).capitalize()} {did}{'' if did.endswith('.') else '.'}"
        elif topic == 4:
            book, comment = rng.choice(BOOKS)
            user = rng.choice(["What are you reading?", "New book?", "Any good book lately?"])
            line = f"{book.capitalize()}. {comment}"
        elif topic == 5:
            meal = rng.choice(MEALS)
            user = rng.choice(
                [
                    f"I had {meal} for lunch.",
                    f"Dinner was {meal}. Again.",
                    f"Guess what I had for lunch. {meal.capitalize()}.",
                ]
            )
            line = rng.choice(
                [
                    "You need to eat better. Here, take a snack.",
                    "That's not a meal, that's a cry for help.",
                    f"Lucky. I had {rng.choice(SNACKS)} standing up.",
                ]
            )
        elif topic == 6:
            chore = rng.choice(CHORES)
            user = rng.choice(["Need a hand with anything?", "Can I help with something?"])
            line = rng.choice(
                [
                    f"Could you help with {chore}? I'll pay you in tea.",
                    f"I've been putting off {chore} all week.",
                ]
            )
        elif topic == 7:
            sound = rng.choice(SOUNDS)
            user = rng.choice(["What's that sound?", "Nice music tonight.", "It's quiet in here."])
            line = rng.choice(
                [
                    f"That's {sound}. I've stopped noticing it.",
                    f"I put on {sound} when the shop gets too quiet.",
                ]
            )
        elif topic == 8:
            feeling, answer = rng.choice(FEELINGS)
            user = rng.choice([f"I feel {feeling} today.", f"Honestly? Kind of {feeling}."])
            line = answer
        else:
            user = rng.choice(
                [
                    "Any plans for your day off?",
                    "Do you ever take a holiday?",
                    "What do you do when the shop is closed?",
                ]
            )
            line = rng.choice(
                [
                    f"Maybe I'll walk to {rng.choice(PLACES)} and do nothing at all.",
                    "Sleep. Then more sleep. Then inventory.",
                    f"I'll try a new blend with {rng.choice(TEAS)}.",
                ]
            )
        if rng.random() < 0.3:
            user = f"{rng.choice(USER_REACTIONS)} {user}"
        if rng.random() < 0.2:
            line = f"{rng.choice(REPLY_REACTIONS)} {line}"
        return user, self._reply(rng, line)


SCRIPT = Script(cast=CAST, beats=BEATS, filler=EnglishFiller())
