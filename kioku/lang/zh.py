"""Chinese, as kioku's checks read it (words by character bigrams: no segmenter is shipped)."""

from __future__ import annotations

from kioku.lang.words import Language

# the commonest family names: a person is told by one before a title (王老师, 李先生) or after
# 小/老 (小王, 老李), the way a chat speaks of someone
SURNAMES = (
    "王李张刘陈杨黄赵吴周徐孙马朱胡郭何高林罗郑梁谢宋唐许韩冯邓曹彭曾肖田董袁潘蒋蔡余杜叶程"
    "苏魏吕丁任沈姚卢姜崔钟谭陆汪范金石廖贾夏韦付方白邹孟熊秦邱江尹薛闫段雷侯龙史陶黎贺顾"
    "毛郝龚邵万钱严覃武戴莫孔汤"
)
TITLES = ("先生", "女士", "小姐", "老师", "同学", "医生", "阿姨", "叔叔", "师傅", "经理", "总")

ZH = Language(
    code="zh",
    letters=((0x4E00, 0x9FFF),),  # Han characters: a word's worth of meaning each
    letter_weight=4.0,
    past_cues=(
        r"还记得|记得|忘了|以前|之前|上次|上回|昨天|前天|上周|上个月|去年|那时|那次|说过|提过|聊过"
    ),
    name_patterns=(
        rf"[{SURNAMES}](?:{'|'.join(TITLES)})",
        rf"[小老][{SURNAMES}]",
    ),
    # a Han character before a title is as often Japanese (田中先生): looked for only where
    # the conversation is Chinese
    names_in_any_conversation=False,
    weekdays=("星期一", "星期二", "星期三", "星期四", "星期五", "星期六", "星期日"),
    numerals={c: i for i, c in enumerate("〇一二三四五六七八九十")} | {"两": 2},
    weekday_numbers={"一": 0, "二": 1, "三": 2, "四": 3, "五": 4, "六": 5, "日": 6, "天": 6},
    framing=frozenset(["说过", "告诉", "问道", "回答", "用户", "角色", "分享"]),
    negation=frozenset("不没别"),
    declining=r"不记得|记不(?:得|清)|想不起|不知道|没(?:有)?(?:提到|说过|提过|印象)",
    first_person=r"我",
    asking=r"问",
    # Chinese words a Japanese sentence has no use for standing alone (我也, 是, 很)
    function_words=frozenset("我也是了吗你很呢吧"),
    user_words=("用户", "使用者"),
    character_words=("角色",),
)
