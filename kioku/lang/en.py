"""English, as kioku's checks read it."""

from __future__ import annotations

from kioku.lang.words import Language, wordset

MONTHS = (
    "January", "February", "March", "April", "May", "June", "July", "August", "September",
    "October", "November", "December",
)  # fmt: skip
WEEKDAYS = ("Monday", "Tuesday", "Wednesday", "Thursday", "Friday", "Saturday", "Sunday")
_MONTHS = "|".join(m.lower() for m in MONTHS)
_WEEKDAYS = "|".join(d.lower() for d in WEEKDAYS)
TIME_WORDS = ("spring", "summer", "autumn", "fall", "winter", "weekend", "night", "time", "week",
              "month", "year")  # fmt: skip
_TIMES = "|".join(TIME_WORDS)
# a past tense in a question ("what did", "how was"): it points at the past only with
# something of that past named beside it
PAST_TENSE = (
    r"(?:when|what|where|who|how|why|which) (?:did|was|were|had)|"
    r"(?:did|have|had) (?:i|we)(?: ever)?"
)
# words that point at the past by themselves: memory, time
PAST_CUES = (
    r"remember(?:ed|s)?|recall(?:ed)?|remind(?:ed)?|forg[oe]t(?:ten)?|mention(?:ed)?|"
    r"told (?:me|you|us)|(?:you|i|we) said|talked about|used to|ago|earlier|yesterday|"
    r"the other (?:day|night)|back (?:then|when|in)|"
    rf"last (?:{_TIMES}|{_WEEKDAYS}|{_MONTHS})|(?:in|on|since) (?:{_MONTHS})"
)

EN = Language(
    code="en",
    letters=((0x41, 0x5A), (0x61, 0x7A)),
    past_cues=PAST_CUES,
    past_tense=PAST_TENSE,
    shared_past=r"(?:did|have|had) (?:i|we)",
    vocatives=("hey", "hi", "hello", "thanks", "thank you", "dear", "oh", "wow", "yo", "huh", "eh"),
    months=MONTHS,
    weekdays=WEEKDAYS,
    day_abbreviations=("tues", "thur", "thurs", "sept"),
    time_words=TIME_WORDS,
    numbers={
        "zero": "0",
        "two": "2",
        "three": "3",
        "four": "4",
        "five": "5",
        "six": "6",
        "seven": "7",
        "eight": "8",
        "nine": "9",
        "ten": "10",
        "eleven": "11",
        "twelve": "12",
        "thirteen": "13",
        "fourteen": "14",
        "fifteen": "15",
        "sixteen": "16",
        "seventeen": "17",
        "eighteen": "18",
        "nineteen": "19",
        "twenty": "20",
        "thirty": "30",
        "forty": "40",
        "fifty": "50",
        "hundred": "100",
        "twice": "2",
    },  # fmt: skip
    counts={
        "a": 1,
        "an": 1,
        "one": 1,
        "two": 2,
        "three": 3,
        "four": 4,
        "five": 5,
        "six": 6,
        "seven": 7,
        "eight": 8,
        "nine": 9,
        "ten": 10,
        "a couple of": 2,
    },  # fmt: skip
    framing=wordset(
        """
        say says said saying tell tells told telling ask asks asked asking share shares shared
        sharing mention mentions mentioned talk talks talked talking discuss discusses discussed
        express expresses expressed explain explains explained describe describes described reply
        replies replied answer answers answered respond responds responded agree agrees agreed
        thank thanks thanked wonder wonders wondered suggest suggests suggested note notes noted
        admit admits admitted claim claims claimed add adds added continue continues continued
        state states stated reveal reveals revealed confirm confirms confirmed inform informs
        informed update updates updated recall recalls recalled point points pointed encourage
        encourages encouraged praise praises praised compliment compliments complimented
        show shows showed shown reveal reveals revealed indicate indicates indicated narration
        narrator thought thoughts inner voice actually really ostensibly
        user character conversation message chat someone something also really very lot lots
        about would could should might must may can will shall whether though although yet
        however because since unless whose anyone everyone anybody everybody anything everything
        nothing another other others thing things way one ones kind sort bit part
        """
    ),
    light_verbs=wordset(
        """
        go goes went gone going get gets got gotten getting make makes made making have has had
        having do does did done doing take takes took taken taking come comes came coming give
        gives gave given giving find finds found finding feel feels felt feeling think thinks
        thought thinking want wants wanted wanting seem seems seemed become becomes became keep
        keeps kept let lets put puts see sees saw seen seeing know knows knew known look looks
        looked looking plan plans planned planning try tries tried trying use uses used using
        recently lately currently now today new always still just even well much many
        """
    ),
    auxiliaries=wordset("have has had having do does did done doing"),
    irregular={
        "went": "go",
        "gone": "go",
        "got": "get",
        "gotten": "get",
        "made": "make",
        "took": "take",
        "taken": "take",
        "came": "come",
        "gave": "give",
        "given": "give",
        "found": "find",
        "felt": "feel",
        "thought": "think",
        "became": "become",
        "kept": "keep",
        "saw": "see",
        "seen": "see",
        "knew": "know",
        "known": "know",
        "told": "tell",
        "said": "say",
        "bought": "buy",
        "brought": "bring",
        "built": "build",
        "caught": "catch",
        "chose": "choose",
        "chosen": "choose",
        "drew": "draw",
        "drawn": "draw",
        "drove": "drive",
        "driven": "drive",
        "ate": "eat",
        "eaten": "eat",
        "fell": "fall",
        "fallen": "fall",
        "flew": "fly",
        "forgot": "forget",
        "forgotten": "forget",
        "grew": "grow",
        "grown": "grow",
        "held": "hold",
        "hurt": "hurt",
        "left": "leave",
        "lost": "lose",
        "met": "meet",
        "paid": "pay",
        "ran": "run",
        "read": "read",
        "rode": "ride",
        "sang": "sing",
        "sung": "sing",
        "sent": "send",
        "sat": "sit",
        "slept": "sleep",
        "spent": "spend",
        "stood": "stand",
        "swam": "swim",
        "swum": "swim",
        "taught": "teach",
        "threw": "throw",
        "thrown": "throw",
        "understood": "understand",
        "woke": "wake",
        "won": "win",
        "wore": "wear",
        "worn": "wear",
        "wrote": "write",
        "written": "write",
        "began": "begin",
        "begun": "begin",
        "broke": "break",
        "broken": "break",
        "heard": "hear",
        "led": "lead",
        "lent": "lend",
        "mean": "mean",
        "meant": "mean",
        "children": "kid",
        "child": "kid",
        "kids": "kid",
        "mother": "mom",
        "mum": "mom",
        "father": "dad",
        "picture": "photo",
        "pictures": "photo",
        "pic": "photo",
        "pics": "photo",
        "image": "photo",
        "images": "photo",
        "photograph": "photo",
        "husband": "husband",
    },  # fmt: skip
    negation=wordset(
        "not no never nothing nobody none neither nor without cannot can't don't doesn't didn't "
        "isn't wasn't aren't weren't won't wouldn't haven't hasn't hadn't couldn't shouldn't"
    ),
    not_names=wordset(
        """
        I I'm I've I'll I'd The A An And But Or So Then This That These Those There Here It Its
        He She They We You His Her Their Our My Your Him Them Us Me Who What When Where Why How
        After Before While During Since Until On In At For From With Without By To Of As If
        Also Both Each Every Some Many Most All No Not Yes Later Earlier Now Today Yesterday
        Tomorrow Tonight User Users Character Message Messages Chapter OPEN DONE QUOTE Mr Mrs Ms
        Dr OK Okay
        """
    ),
    declining=(
        r"\b(?:(?:do|does|did|could)(?:n't|n’t| not)|can(?:'t|’t|not| not)) "
        r"(?:remember|recall|know)\b|"
        r"\bnot (?:been )?mentioned\b|\bno idea\b|\bno (?:memory|recollection) of\b|"
        r"\b(?:never|haven't|hasn't) (?:said|told|mentioned)\b"
    ),
    first_person=r"\b(?:[Ii](?:'m|'ve|'ll|'d)?|[Mm]y|me|mine|[Ww]e(?:'re|'ve)?|[Oo]ur|us)\b",
    asking=(
        r"\b(?:ask|asks|asked|asking|wonder|wonders|wondered|wondering|question|questions|"
        r"inquire|inquires|inquired|whether)\b"
    ),
    fillers=wordset(
        """
        yeah yes yep yup no nope ok okay oh ah aw wow haha hahaha lol hey hi hello bye goodbye
        thanks thank thx sure cool great awesome nice glad sounds sound good right totally
        definitely amazing really so well um uh hmm hm gonna wanna gotta lot lots much always
        also anyway anyways though indeed true exactly absolutely agree agreed love like know
        think guess mean feel felt see seems sounds awesome incredible wonderful fantastic super
        pretty kinda sorta stuff thing things something anything everything tell told talk
        talking chat chatting catch care take fair enough maybe perhaps probably course
        """
    ),
    deictic=wordset("that this it these those there here"),
    clitics=wordset("s t ll re ve d m"),
    contracted=wordset("don doesn didn isn wasn can won"),
    greetings=(r"hey|hi|hello|hiya|yo|bye|goodbye|good (?:morning|night|evening)|thanks|thank you"),
    greeting_tails=r"there|all|guys|so much",
    user_words=("user", "the user"),
    character_words=("character", "the character"),
)
