"""Korean, as kioku's checks read it: words are what spaces part, read without the particle
they end on (친구를 → 친구), so a line and its message meet on the same word."""

from __future__ import annotations

from kioku.lang.words import Language, wordset

HONORIFICS = ("씨", "님")

KO = Language(
    code="ko",
    # Hangul syllables, and the jamo they are built of (alone in ㅋㅋ, ㅠㅠ)
    letters=((0xAC00, 0xD7AF), (0x1100, 0x11FF), (0x3130, 0x318F)),
    letter_weight=4.0,
    past_cues=(
        r"기억(?:나|해|하)|잊었|잊어버|예전에|전에|저번에|지난번|지난주|지난달|작년|어제|그저께|"
        r"그때|옛날에|말했|얘기했|이야기했"
    ),
    # a Korean name is told by its honorific (민수 씨, 지영님)
    name_patterns=(rf"[\uac00-\ud7af]{{2,3}} ?(?:{'|'.join(HONORIFICS)})",),
    name_suffixes=HONORIFICS,
    weekdays=("월요일", "화요일", "수요일", "목요일", "금요일", "토요일", "일요일"),
    negation=frozenset(["안", "못"]),
    negation_parts=frozenset(["않", "없", "아니"]),
    declining=r"기억(?:이|가)? ?안 ?나|기억나지 않|기억이 없|모르겠|몰라|언급(?:되지|하지) 않",
    first_person=r"(?<![\uac00-\ud7af])(?:나는|내가|저는|제가|우리|나도|저도)",
    asking=r"물었|물어|질문|궁금",
    # particles and copulas a word ends on: read without them (the longest that fits first)
    particles=wordset(
        """
        이에요 이예요 예요 이야 에서는 에게서 한테서 으로는 까지는 이라고 에서 에게 한테 으로
        부터 까지 처럼 보다 하고 이랑 라고 이나 은 는 이 가 을 를 에 의 도 와 과 로 랑 나 요
        """
    ),
    user_words=("사용자",),
    character_words=("캐릭터",),
)
