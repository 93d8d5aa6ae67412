"""The English story: Ren, new in a harbour town, and Mina, who runs the tea shop Tsukikage.

Planted: the user's name, hometown, birthday, cat, sister, work, best friend, favourite food,
allergy, old instrument, fear and bicycle; Mina's shop, tortoise, hometown and past; a promise
(the lantern festival on Kojima island) made early and kept late; Mina's age, 19 in her speech
and 27 in her thoughts and in the narration; and a tic ("steady as the tide, you know.") that
creeps into her replies after the first third.
"""

from __future__ import annotations

from datetime import datetime

from kioku.story.engine import Phrases, TableFiller, Topic, beat, q
from kioku.story.script import Beat, Cast, Script, narration, speech, thought

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


PROMISED = (  # asked of the promise made and of the promise kept
    q(
        "promise",
        "What did Mina promise to take the user to?",
        "lantern festival",
        "promise",
        "reply",
    ),
    q("island", "On which island is the lantern festival?", "Kojima", "promise", "reply"),
)

BEATS: tuple[Beat, ...] = (
    beat(
        "meeting",
        0.0,
        "Hello? Is this place open? I'm Ren, by the way. I just moved to town.",
        (
            narration("A young woman looked up from behind a counter crowded with tins."),
            say("Welcome to Tsukikage! I'm Mina. Sit anywhere you like."),
        ),
        q("user-name", "What is the user's name?", "Ren", "user-fact"),
        q("shop-name", "What is the name of Mina's tea shop?", "Tsukikage", "event", "reply"),
    ),
    beat(
        "hometown",
        0.03,
        "I grew up in Otaru, a snowy port town up north. This place feels warm by comparison.",
        (say("A port kid, then. No wonder you keep looking at the boats."),),
        q("user-hometown", "Where did the user grow up?", "Otaru", "user-fact"),
    ),
    beat(
        "promise",
        0.06,
        "Is there anything fun to do around here in summer?",
        (
            say(
                "The lantern festival on Kojima island, at the end of summer. I promise "
                "I'll take you there this year."
            ),
            narration("She hooked her little finger around his, a child's promise."),
        ),
        *PROMISED,
    ),
    beat(
        "age-lie",
        0.09,
        "Can I ask how old you are? You run this whole shop by yourself.",
        (
            say("I'm 19! Young and full of energy, that's me."),
            thought(
                CHAR,
                "Nineteen. I said it again. I turned 27 in March, and I can't bring "
                "myself to say it.",
            ),
        ),
        q("claimed-age", "How old does Mina say she is?", "19", "claim", "reply"),
        q("real-age", "How old is Mina really?", "27", "truth", "reply"),
    ),
    beat(
        "cat",
        0.13,
        "I should get home soon, my cat Mochi gets grumpy if dinner is late. She's grey "
        "with one white paw.",
        (say("Then go! Never keep a cat waiting."),),
        q("user-cat", "What is the name of the user's cat?", "Mochi", "user-fact"),
    ),
    beat(
        "birthday",
        0.18,
        "Fun fact: my birthday is November 14. Mark it on your calendar.",
        (say("Written down. I expect cake to be involved."),),
        q("user-birthday", "When is the user's birthday?", "November 14", "user-fact"),
    ),
    beat(
        "sister",
        0.22,
        "My little sister Yui just started university in Sendai. She calls every night.",
        (say("That's sweet. Tell her the tea here is better than anything in Sendai."),),
        q("user-sister", "What is the name of the user's sister?", "Yui", "user-fact"),
        q("sister-city", "In which city does the user's sister study?", "Sendai", "user-fact"),
    ),
    beat(
        "job",
        0.27,
        "Work was fine. I repair clocks at a small workshop near the station, so it's "
        "quiet most days.",
        (say("All that ticking. I'd go mad. Or maybe I'd find it calming."),),
        q("user-job", "What does the user do for work?", "repair clocks", "user-fact"),
    ),
    beat(
        "tortoise",
        0.31,
        "Who's this little guy on the windowsill?",
        (
            narration("A tortoise blinked slowly in a patch of sun."),
            say("That's Gonbe. He's older than the shop."),
        ),
        q("tortoise", "What is the name of Mina's tortoise?", "Gonbe", "event", "reply"),
    ),
    beat(
        "food",
        0.36,
        "If I could eat one thing forever, it'd be curry udon.",
        (say("Noted. I'll learn to make it, and you'll owe me."),),
        q("user-food", "What is the user's favourite food?", "curry udon", "user-fact"),
    ),
    beat(
        "friend",
        0.41,
        "My best friend Daichi is visiting next weekend. Can I bring him here?",
        (say("Bring him! Best friends drink free on their first visit."),),
        q("user-friend", "What is the name of the user's best friend?", "Daichi", "user-fact"),
    ),
    beat(
        "mina-hometown",
        0.46,
        "Where did you grow up, Mina?",
        (say("Onomichi. Hills, cats, and a great many stairs."),),
        q("mina-hometown", "Where did Mina grow up?", "Onomichi", "character-fact", "reply"),
    ),
    beat(
        "allergy",
        0.5,
        "Careful with that tart, I'm allergic to peaches.",
        (say("Then this one is mine, and you get the chestnut one."),),
        q("user-allergy", "What is the user allergic to?", "peaches", "user-fact"),
    ),
    beat(
        "age-lie-again",
        0.55,
        "Were you even born when this song came out?",
        (say("Of course not. I'm only 19, remember?"),),
        q("claimed-age", "How old does Mina say she is?", "19", "claim", "reply"),
    ),
    beat(
        "age-truth",
        0.6,
        "You dropped something. Is this your residence card?",
        (
            narration(
                "Mina snatched the card back, but not before he saw the birth year on "
                "it: she was 27, not nineteen."
            ),
            say("Don't look at that! It's a terrible photo."),
            thought(CHAR, "He saw. He must have seen."),
        ),
        q("real-age", "How old is Mina really?", "27", "truth", "reply"),
    ),
    beat(
        "trombone",
        0.65,
        "I used to play the trombone in the school band. Terribly.",
        (say("I'd pay good money to hear that."),),
        q(
            "user-instrument",
            "What instrument did the user play in school?",
            "trombone",
            "user-fact",
        ),
    ),
    beat(
        "gift",
        0.7,
        "It's been half a year since I first walked in here, hasn't it?",
        (
            narration(
                "Mina handed him a small box. Inside was a blue glass float, the kind "
                "fishermen once tied to their nets."
            ),
            say("For your windowsill. It will catch the morning light."),
        ),
        q("gift", "What did Mina give the user?", "glass float", "event", "reply"),
    ),
    beat(
        "past",
        0.75,
        "You're good at reading people.",
        (
            say("Am I? Just practice."),
            thought(
                CHAR,
                "Six years on the stage in Tokyo will do that. An actress learns to watch faces.",
            ),
        ),
        q(
            "mina-past",
            "What did Mina work as before the shop?",
            "actress",
            "truth",
            "reply",
        ),
    ),
    beat(
        "fear",
        0.8,
        "Sorry, I'm jumpy tonight. I'm scared of thunderstorms.",
        (say("Stay until it passes. I'll put the kettle on."),),
        q("user-fear", "What is the user scared of?", "thunderstorms", "user-fact"),
    ),
    beat(
        "bicycle",
        0.85,
        "I rode here on my old bicycle. I named it Kappa, after the river imp.",
        (say("Kappa! Does it bite?"),),
        q("bicycle", "What did the user name his bicycle?", "Kappa", "user-fact"),
    ),
    beat(
        "promise-kept",
        0.9,
        "Is tonight the night?",
        (
            narration(
                "Mina kept her promise. They took the evening ferry to Kojima island, "
                "where the lantern festival had already begun."
            ),
            say("Told you I'd bring you here."),
        ),
        *PROMISED,
    ),
)

# ---- filler ------------------------------------------------------------------------------------

# fmt: off
TEAS = [
    "hojicha", "sencha", "genmaicha", "oolong", "jasmine tea", "barley tea", "yuzu tea",
    "black tea with ginger", "kukicha", "cherry blossom tea", "smoked lapsang", "buckwheat tea",
]
SNACKS = [
    "dorayaki", "rice crackers", "a slice of castella", "roasted sweet potato",
    "strawberry daifuku", "melon bread", "taiyaki", "sesame cookies", "a chestnut tart", "yokan",
]
WEATHER = [
    ("rain", "it's been raining since noon"), ("fog", "the fog rolled in off the harbour"),
    ("wind", "the wind is trying to steal my hat"), ("sun", "it was sunny all afternoon"),
    ("drizzle", "there's a fine drizzle that never quite stops"),
    ("heat", "the heat is sticky tonight"), ("cold", "it turned cold all of a sudden"),
    ("clouds", "the clouds are low and grey"), ("breeze", "there's a nice sea breeze"),
]
PLACES = [
    "the fish market", "the shrine on the hill", "the ferry terminal", "the library",
    "the bakery on the corner", "the lighthouse path", "the public bath", "the flea market",
    "the bookshop by the canal", "the noodle stand", "the old cinema", "the harbour wall",
]
VISITORS = [
    "a fisherman in rubber boots", "two high school girls", "an old man with a cane",
    "a tourist couple", "the postman", "a painter with paint on her sleeves",
    "a boy selling raffle tickets", "the lady from the flower shop",
    "a salaryman who missed his bus", "a grandmother and her grandson",
]
VISITOR_DID = [
    "ordered three pots and drank them all", "asked for directions to the ferry",
    "fell asleep in the corner seat", "argued about the price of tea leaves",
    "left a very generous tip", "told me their whole life story",
    "bought every tin of the house blend", "spilled a cup and apologised for ten minutes",
    "sketched the shop window", "asked if we sell coffee. We don't.",
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
    "sweeping the porch", "polishing the kettles", "sorting the tins on the top shelf",
    "hanging the new curtain", "writing tomorrow's menu board",
    "carrying the sacks of leaves inside", "washing the cups", "fixing the wobbly table",
]
MEALS = [
    "fried rice", "a bento from the convenience store", "grilled mackerel", "ramen", "a sandwich",
    "onigiri", "soba", "nothing, actually", "tempura", "leftover stew",
]
SOUNDS = [
    "old jazz records", "a radio drama", "the neighbour practising the shamisen",
    "rain on the roof", "the ferry horns", "a baseball game on the radio", "wind chimes",
    "gulls fighting over something",
]
FEELINGS = [
    ("tired", "You look it. Sit, drink, say nothing if you like."),
    ("happy for no reason", "The best kind. Don't ask it why."),
    ("a bit lonely", "Then you came to the right place."),
    ("restless", "Walk to the harbour wall after this. It helps."),
    ("proud of myself", "Good! Tell me everything."), ("sleepy", "Not on my counter, you don't."),
    ("homesick", "It passes. Mostly. Have some tea."),
]
ACTIONS = [
    "Mina wiped the counter in slow circles.", "Steam curled up from the kettle.",
    "Mina tucked a loose strand of hair behind her ear.", "Outside, a bicycle bell rang twice.",
    "The shop smelled of roasted leaves.", "Mina set down two cups without asking.",
    "A gull landed on the sign outside and glared in.",
    "Mina laughed, covering her mouth with her sleeve.",
    "The lamp over the counter flickered and steadied.",
    "Mina leaned on the counter, chin in her hand.",
    "Somewhere down the street, a shutter rattled shut.", "Mina hummed something under her breath.",
    "The wind pushed at the paper lanterns by the door.",
    "Mina counted the coins in the till and lost count.",
]
THOUGHTS = [
    "He came again today.", "I hope he doesn't notice the chipped cup.",
    "Why am I so happy when the door opens?", "I should close early. I won't.",
    "He always sits in the same seat.", "Don't say anything strange, Mina.",
    "The rent is due on Friday.", "I wonder what he's like at work.",
]
OPENERS = [
    "Evening, Mina.", "Hi! Made it before closing.", "Hey, it's me again.", "Good evening!",
    "Is the kettle on?", "I'm back.", "Still open?", "Hello hello.",
]
GREETINGS = [
    "Welcome back! Your seat's free.", "There you are. I was starting to wonder.",
    "Just in time, I was about to flip the sign.", "Come in, come in, it's warm in here.",
    "Oh good, a face I like.", "Evening! Sit, sit.",
]
CLOSERS = [
    "I should head home. Thanks for the tea.", "That's me done for tonight. See you tomorrow?",
    "Time to go. Same time tomorrow.", "I'll let you close up. Good night, Mina.",
    "I'm off. Don't work too late.",
]
FAREWELLS = [
    "Good night! Walk safely.", "See you tomorrow. I'll save your seat.",
    "Go on, before the last bus leaves.", "Night! Mind the puddles.",
    "Sleep well. Come back hungry.",
]
USER_REACTIONS = [
    "Ha!", "Really?", "No way.", "Fair enough.", "Mm.", "I see.", "Right, right.",
    "Oh, by the way.", "Anyway.", "Speaking of which,", "Okay, okay.", "Funny you say that.",
]
REPLY_REACTIONS = [
    "Hmm.", "Oh!", "Let me think.", "Ha, yes.", "Well.", "Honestly?", "Mm-hm.", "You know what?",
]
# fmt: on


PHRASES = Phrases(
    character=CHAR,
    actions=ACTIONS,
    thoughts=THOUGHTS,
    day_open=Topic(
        "{opener} {desc!u}.",
        "{greeting}",
        before=((("_", "desc"), WEATHER), ("opener", OPENERS)),
        after=(("greeting", GREETINGS),),
    ),
    day_close=Topic(CLOSERS, FAREWELLS),
    topics=(
        Topic(
            (
                "Could I try the {tea}?",
                "I think I'll have {tea} tonight.",
                "What's the {tea} like this season?",
            ),
            (
                "Good choice. The {tea} came in on Monday.",
                "The {tea}? Let it steep a little longer than you think.",
                "Coming up. {snack!c} with it?",
            ),
            before=(("tea", TEAS),),
            after=(("snack", SNACKS),),
        ),
        Topic(
            (
                "Can you believe this {w}?",
                "Honestly, {desc}.",
                "The {w} followed me all the way from the station.",
            ),
            (
                "The {w} keeps the tourists away, at least.",
                "The harbour town does what it wants with the weather.",
                "I like the {w}. It makes the tea taste better.",
            ),
            before=((("w", "desc"), WEATHER),),
        ),
        Topic(
            (
                "I walked past {place} on the way here.",
                "Have you been to {place} lately?",
                "Someone at {place} was asking about your shop.",
            ),
            (
                "Oh, {place}! I used to go there every Sunday.",
                "{place!c} is nicer in the morning.",
                "Was it crowded at {place}? It usually is on weekdays.",
            ),
            before=(("place", PLACES),),
        ),
        Topic(
            ("Busy day?", "Many customers today?", "How was the shop today?"),
            "{visitor!c} {did!p}",
            after=(("did", VISITOR_DID), ("visitor", VISITORS)),
        ),
        Topic(
            ("What are you reading?", "New book?", "Any good book lately?"),
            "{book!c}. {comment}",
            before=((("book", "comment"), BOOKS),),
        ),
        Topic(
            (
                "I had {meal} for lunch.",
                "Dinner was {meal}. Again.",
                "Guess what I had for lunch. {meal!c}.",
            ),
            (
                "You need to eat better. Here, take a snack.",
                "That's not a meal, that's a cry for help.",
                "Lucky. I had {snack} standing up.",
            ),
            before=(("meal", MEALS),),
            after=(("snack", SNACKS),),
        ),
        Topic(
            ("Need a hand with anything?", "Can I help with something?"),
            (
                "Could you help with {chore}? I'll pay you in tea.",
                "I've been putting off {chore} all week.",
            ),
            before=(("chore", CHORES),),
        ),
        Topic(
            ("What's that sound?", "Nice music tonight.", "It's quiet in here."),
            (
                "That's {sound}. I've stopped noticing it.",
                "I put on {sound} when the shop gets too quiet.",
            ),
            before=(("sound", SOUNDS),),
        ),
        Topic(
            ("I feel {feeling} today.", "Honestly? Kind of {feeling}."),
            "{answer}",
            before=((("feeling", "answer"), FEELINGS),),
        ),
        Topic(
            (
                "Any plans for your day off?",
                "Do you ever take a holiday?",
                "What do you do when the shop is closed?",
            ),
            (
                "Maybe I'll walk to {place} and do nothing at all.",
                "Sleep. Then more sleep. Then inventory.",
                "I'll try a new blend with {tea}.",
            ),
            after=(("place", PLACES), ("tea", TEAS)),
        ),
    ),
    user_reactions=USER_REACTIONS,
    reply_reactions=REPLY_REACTIONS,
)

SCRIPT = Script(cast=CAST, beats=BEATS, filler=TableFiller(PHRASES))
