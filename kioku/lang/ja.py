"""Japanese, as kioku's checks read it (its words by SudachiPy's dictionary forms)."""

from __future__ import annotations

from kioku.lang.words import Language, wordset

HONORIFICS = ("さん", "ちゃん", "くん", "様")

JA = Language(
    code="ja",
    letters=((0x3040, 0x30FF),),  # kana: no other language writes them
    letter_weight=4.0,
    borrows=("zh",),  # kanji: Han characters, which a Chinese text holds alone
    past_cues=(
        r"覚えて|憶えて|思い出|忘れ|この前|こないだ|この間|以前|昨日|一昨日|おととい|先週|先月|"
        r"去年|昨年|おととし|あの時|あのとき|あの頃|あの日|[日週月年]前|言って(?:た|まし)|"
        r"話して(?:た|まし)|話した|言った|聞いた|教えて(?:くれ)?た|っけ[？?]?$"
    ),
    # a Japanese name is told by its honorific (ハナコさん, 田中くん, お母さん)
    name_patterns=(rf"[\u4e00-\u9fff\u30a0-\u30ff々]{{1,6}}(?:{'|'.join(HONORIFICS)})",),
    name_suffixes=HONORIFICS,
    weekdays=("月", "火", "水", "木", "金", "土", "日"),
    numerals={c: i for i, c in enumerate("〇一二三四五六七八九十")},
    weekday_numbers={"月": 0, "火": 1, "水": 2, "木": 3, "金": 4, "土": 5, "日": 6},
    framing=wordset(
        """
        言う 話す 尋ねる 聞く 訊く 答える 伝える 述べる 語る 説明 質問 返事 回答 同意 感謝
        提案 共有 紹介 報告 確認 話 発言 会話 メッセージ ユーザー キャラクター 相手 自分 彼 彼女
        画像 写真 最近 今回 とても すごく 特に 一緒
        """
    ),
    negation=frozenset(("ない", "ぬ", "ず", "ません", "なかった", "無い")),
    declining=r"覚えて(?:い)?な|思い出せな|記憶にな|わから(?:な|ん)|分から(?:な|ん)|知らな|聞いて(?:い)?な",
    first_person=r"私|僕|俺|あたし|わたし|ぼく|おれ",
    asking=r"尋ね|訊|聞い|聞き|聞く|質問|問い|かどうか",
    spoken_endings=r"です|ます|でした|ました|ません|ましょう|でしょう|けど|よね|かな",
    reported_speech=r"(?:と|って)(?:言|い[っいうわ]|話し|述べ|書い)|とのこと|そうです",
    deictic=wordset(
        "あれ アレ それ ソレ これ コレ あそこ そこ ここ あっち そっち こっち あの その この"
    ),
    people=wordset(
        """
        子供 子ども こども 息子 娘 夫 妻 主人 旦那 嫁 奥さん 母 父 母親 父親 お母さん お父さん 姉
        妹 兄 弟 祖母 祖父 おばあちゃん おじいちゃん 彼 彼女 彼氏
        友達 友人 家族 孫 両親 親 上司 同僚 長男 長女 次男 次女 甥 姪 いとこ 親戚 家内 パートナー
        犬 猫 愛犬 愛猫 ペット 姉妹 兄弟 子 赤ちゃん 主人
        """
    ),
    pets=wordset("犬 猫 愛犬 愛猫 ペット"),
    first_person_words=wordset("私 わたし 僕 ぼく 俺 おれ 自分 あたし わたくし 私たち 僕ら"),
    second_person_words=frozenset(["あなた", "君", "きみ", "あんた", "そちら", "お宅"]),
    interrogatives=wordset(
        "何 なに なん 何か どれ どこ どちら どっち だれ 誰 いつ どう どんな どの なぜ どうして "
        "いくつ いくら"
    ),
    user_words=("ユーザー", "ユーザ"),
    character_words=("キャラクター",),
)
