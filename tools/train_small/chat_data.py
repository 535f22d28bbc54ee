#!/usr/bin/env python3
"""Synthetic DeepSeek-V4 chat conversations for fine-tuning models/small, rendered to the exact V4 prompt text.

Usage:
    python3 tools/train_small/chat_data.py --n N --seed S --out FILE.jsonl[.gz] [--stats]
    python3 tools/train_small/chat_data.py --n N --seed S --stats [--token-stats]
    python3 tools/train_small/chat_data.py --check http://127.0.0.1:18411 --n N --seed S

Standard library only. The API:
  * TOOLS: eight OpenAI tool definitions {"type": "function", "function": {"name", "description",
    "parameters"}} (get_weather, get_time, search_books, calculate, convert_currency, send_message,
    define_word, set_reminder);
  * conversations(n, seed) -> [{"messages", "tools", "thinking", "kind"}]: OpenAI-style messages (the last
    one an assistant turn), the request's tools (None without tools), thinking mode on / off, and the kind
    (tool_think, tool_chat, tool_unneeded, no_tools; "kind" is for statistics only). Deterministic for a seed;
  * render(conv) -> str: the whole conversation as DeepSeek-V4 text, byte-identical to the engine's
    chat::encode_chat (src/chat/chat_encoding.cpp, docs/design/chat-encoding.md) with the same messages,
    tools and thinking flag: BOS, system (+ the tools section), user turns, hand-overs, assistant turns
    each closed by EOS, tool results merged into user turns;
  * main(): --out writes one {"text": render(conv)} per line (gzip if the name ends in .gz); --stats prints
    the count, character-length percentiles and the mix of kinds (--token-stats adds token-length
    percentiles from the engine's tokenizer CLI); --check URL asks a running `dsv4 serve` to tokenize every
    conversation (POST URL/tokenize with the messages, the last assistant message marked "prefix": true
    because the server refuses a finished assistant turn as the last message; prefix only drops the final
    EOS) and compares its ids + [EOS] with `dsv4 tokenize --jsonl` of render(conv), and the server's
    /detokenize of its ids with render(conv) minus the final EOS. Exits 1 on any mismatch.

The mix (shares of conversations):
  tool_think    ~35%  thinking mode; a tool call (10% of them two calls in one turn), the tool's JSON result,
                      the final answer; reasoning before every assistant turn; sometimes a "thanks" turn after
  tool_chat     ~20%  the same in chat mode (no reasoning)
  tool_unneeded ~15%  tools given but not needed (greeting, thanks, "what can you do", a sentence); both modes
  no_tools      ~30%  question / answer without tools (greetings, arithmetic, who wrote a book, a sentence, a
                      word's meaning); both modes; sometimes two user turns
"""
import argparse
import gzip
import json
import os
import random
import subprocess
import sys
import urllib.error
import urllib.request

HERE = os.path.dirname(os.path.abspath(__file__))
REPO = os.path.normpath(os.path.join(HERE, "..", ".."))

# ---------------------------------------------------------------------------------------------------------
# The format (src/chat/chat_tokens.h, src/chat/chat_encoding.cpp)

BOS = "<｜begin▁of▁sentence｜>"
EOS = "<｜end▁of▁sentence｜>"
USER = "<｜User｜>"
ASSISTANT = "<｜Assistant｜>"
THINK_START = "<think>"
THINK_END = "</think>"
TOOL_CALLS_OPEN = "<｜DSML｜tool_calls>"
TOOL_CALLS_CLOSE = "</｜DSML｜tool_calls>"
INVOKE_OPEN = "<｜DSML｜invoke"
INVOKE_CLOSE = "</｜DSML｜invoke>"
PARAMETER_OPEN = "<｜DSML｜parameter"
PARAMETER_CLOSE = "</｜DSML｜parameter>"
TOOL_RESULT_OPEN = "<tool_result>"
TOOL_RESULT_CLOSE = "</tool_result>"

TOOLS_TEMPLATE = (
    "## Tools\n"
    "\n"
    "You have access to a set of tools to help answer the user's question. You can invoke tools by writing a "
    "\"<｜DSML｜tool_calls>\" block like the following:\n"
    "\n"
    "<｜DSML｜tool_calls>\n"
    "<｜DSML｜invoke name=\"$TOOL_NAME\">\n"
    "<｜DSML｜parameter name=\"$PARAMETER_NAME\" string=\"true|false\">$PARAMETER_VALUE</｜DSML｜parameter>\n"
    "...\n"
    "</｜DSML｜invoke>\n"
    "<｜DSML｜invoke name=\"$TOOL_NAME2\">\n"
    "...\n"
    "</｜DSML｜invoke>\n"
    "</｜DSML｜tool_calls>\n"
    "\n"
    "String parameters should be specified as is and set `string=\"true\"`. For all other types (numbers, "
    "booleans, arrays, objects), pass the value in JSON format and set `string=\"false\"`.\n"
    "\n"
    "If thinking_mode is enabled (triggered by <think>), you MUST output your complete reasoning inside "
    "<think>...</think> BEFORE any tool calls or final response.\n"
    "\n"
    "Otherwise, output directly after </think> with tool calls or final response.\n"
    "\n"
    "### Available Tool Schemas\n"
    "\n"
    "@SCHEMAS@\n"
    "\n"
    "You MUST strictly follow the above defined tool name and parameter schemas to invoke tool calls.\n")


def _dumps(value):
    """Python's json.dumps as the format writes it (ensure_ascii=False, default separators)."""
    return json.dumps(value, ensure_ascii=False)


def _text(content):
    """OpenAI content: a string, None, or a list of {"type": "text"} parts joined with a blank line."""
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    return "\n\n".join(part["text"] for part in content)


def render_tools(tools):
    schemas = "\n".join(_dumps(tool["function"]) for tool in tools)
    return TOOLS_TEMPLATE.replace("@SCHEMAS@", schemas)


def _render_parameters(arguments):
    if arguments is None:
        return ""
    if not isinstance(arguments, str):  # an object: serialised as the engine does (py_json_dumps)
        arguments = _dumps(arguments)
    if arguments.strip(" \t\r\n") == "":
        return ""
    try:
        args = json.loads(arguments)
    except ValueError:
        args = {"arguments": arguments}
    if not isinstance(args, dict):
        raise ValueError("tool call arguments must be a JSON object, got " + arguments)
    lines = []
    for key, value in args.items():
        if isinstance(value, str):
            lines.append(f'{PARAMETER_OPEN} name="{key}" string="true">{value}{PARAMETER_CLOSE}')
        else:
            lines.append(f'{PARAMETER_OPEN} name="{key}" string="false">{_dumps(value)}{PARAMETER_CLOSE}')
    return "\n".join(lines)


def render_tool_calls(calls):
    if not calls:
        return ""
    invokes = []
    for call in calls:
        f = call["function"]
        invokes.append(f'{INVOKE_OPEN} name="{f["name"]}">\n{_render_parameters(f.get("arguments"))}\n{INVOKE_CLOSE}')
    return "\n\n" + TOOL_CALLS_OPEN + "\n" + "\n".join(invokes) + "\n" + TOOL_CALLS_CLOSE


def render(conv, add_generation_prompt=True):
    """The V4 text of conv ({"messages", "tools", "thinking"}), as chat::encode_chat writes it."""
    messages = conv["messages"]
    tools = conv.get("tools") or []
    thinking = bool(conv.get("thinking"))
    has_tools = bool(tools)
    tools_text = render_tools(tools) if has_tools else ""

    # Merge: tools on the leading system message (or an empty one); tool / user messages into user turns.
    turns = []  # {"role", "msg", "blocks": [(is_tool_result, text, tool_call_id)], "has_tools"}
    first = 0
    if has_tools:
        if messages and messages[0]["role"] in ("system", "developer"):
            turns.append({"role": messages[0]["role"], "msg": messages[0], "blocks": [], "has_tools": True})
            first = 1
        else:
            turns.append({"role": "system", "msg": None, "blocks": [], "has_tools": True})
    for m in messages[first:]:
        role = m["role"]
        after_user = bool(turns) and turns[-1]["role"] == "user" and turns[-1]["msg"] is None
        if role in ("tool", "user"):
            block = (role == "tool", _text(m.get("content")), m.get("tool_call_id") or "")
            if after_user:
                turns[-1]["blocks"].append(block)
            else:
                turns.append({"role": "user", "msg": None, "blocks": [block], "has_tools": False})
        else:
            turns.append({"role": role, "msg": m, "blocks": [], "has_tools": False})

    # Several tool results in one user turn: in the order of the latest assistant turn's calls (stable).
    order = {}
    for t in turns:
        if t["role"] == "assistant" and t["msg"].get("tool_calls"):
            order = {}
            for k, call in enumerate(t["msg"]["tool_calls"]):
                if call.get("id"):
                    order[call["id"]] = k
        elif t["role"] == "user" and order:
            results = [b for b in t["blocks"] if b[0]]
            if len(results) < 2:
                continue
            results.sort(key=lambda b: order.get(b[2], 0))
            it = iter(results)
            t["blocks"] = [next(it) if b[0] else b for b in t["blocks"]]

    def last_user_index(ts):
        for i in range(len(ts) - 1, -1, -1):
            if ts[i]["role"] in ("user", "developer"):
                return i
        return -1

    drop = not has_tools  # conversations with tools keep every turn's reasoning
    if thinking and drop:  # developer turns before the last user turn go; assistant reasoning is not rendered
        lu = last_user_index(turns)
        turns = [t for i, t in enumerate(turns)
                 if i >= lu or t["role"] in ("user", "system", "latest_reminder", "assistant")]
    last_user = last_user_index(turns)

    out = [BOS]
    for i, t in enumerate(turns):
        role, m = t["role"], t["msg"]
        if role == "system":
            if m is not None:
                out.append(_text(m.get("content")))
            if t["has_tools"]:
                out.append("\n\n" + tools_text)
        elif role == "developer":
            out.append(USER + _text(m.get("content")))
            if t["has_tools"]:
                out.append("\n\n" + tools_text)
        elif role == "user":
            parts = [TOOL_RESULT_OPEN + text + TOOL_RESULT_CLOSE if is_result else text
                     for is_result, text, _ in t["blocks"]]
            out.append(USER + "\n\n".join(parts))
        elif role == "latest_reminder":
            out.append("<｜latest_reminder｜>" + _text(m.get("content")))
        elif role == "assistant":
            if thinking and (not drop or i > last_user):
                out.append((m.get("reasoning_content") or m.get("reasoning") or "") + THINK_END)
            out.append(_text(m.get("content")))
            out.append(render_tool_calls(m.get("tool_calls")))
            if not m.get("prefix"):
                out.append(EOS)
        else:
            raise ValueError("unknown role " + role)
        last = i + 1 == len(turns)
        if not last and turns[i + 1]["role"] not in ("assistant", "latest_reminder"):
            continue
        if role not in ("user", "developer"):
            continue
        if last and not add_generation_prompt:
            continue
        out.append(ASSISTANT + (THINK_START if thinking and (not drop or i >= last_user) else THINK_END))
    return "".join(out)


# ---------------------------------------------------------------------------------------------------------
# Tools

def _tool(name, description, properties, required):
    return {"type": "function", "function": {"name": name, "description": description, "parameters": {
        "type": "object", "properties": properties, "required": required}}}


_S = {"type": "string"}
TOOLS = [
    _tool("get_weather", "Get the current weather in a city.",
          {"city": _S, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]}}, ["city"]),
    _tool("get_time", "Get the local time in a city.", {"city": _S}, ["city"]),
    _tool("search_books", "Search books by author or topic.",
          {"query": _S, "max_results": {"type": "integer"}}, ["query"]),
    _tool("calculate", "Evaluate an arithmetic expression.", {"expression": _S}, ["expression"]),
    _tool("convert_currency", "Convert an amount of money between currencies.",
          {"amount": {"type": "number"}, "from_currency": _S, "to_currency": _S},
          ["amount", "from_currency", "to_currency"]),
    _tool("send_message", "Send a text message to a person.", {"to": _S, "text": _S}, ["to", "text"]),
    _tool("define_word", "Look up the meaning of an English word.", {"word": _S}, ["word"]),
    _tool("set_reminder", "Set a reminder some minutes from now.",
          {"text": _S, "minutes": {"type": "integer"}}, ["text", "minutes"]),
]
TOOL_BY_NAME = {t["function"]["name"]: t for t in TOOLS}
TOOL_ABILITY = {
    "get_weather": "check the weather", "get_time": "tell the time in a city", "search_books": "search for books",
    "calculate": "do calculations", "convert_currency": "convert currencies", "send_message": "send messages",
    "define_word": "look up words", "set_reminder": "set reminders",
}

# ---------------------------------------------------------------------------------------------------------
# Slot values

CITIES = [
    "Paris", "London", "Tokyo", "Berlin", "Madrid", "Rome", "Cairo", "Lima", "Oslo", "Sydney", "Toronto",
    "Chicago", "Mumbai", "Beijing", "Seoul", "Moscow", "Dublin", "Vienna", "Prague", "Lisbon", "Athens",
    "Istanbul", "Nairobi", "Lagos", "Bangkok", "Jakarta", "Manila", "Mexico City", "Buenos Aires", "Santiago",
    "Bogota", "Boston", "Denver", "Seattle", "Vancouver", "Stockholm", "Helsinki", "Warsaw", "Amsterdam",
    "Zurich", "Singapore", "Dubai", "New York", "Cape Town",
]
CONDITIONS = ["sunny", "cloudy", "rainy", "windy", "foggy", "clear", "partly cloudy", "stormy"]

AUSTEN, MELVILLE, SHAKESPEARE = "Jane Austen", "Herman Melville", "William Shakespeare"
BOOKS = [  # title, author, topics
    ("Emma", AUSTEN, ["love", "marriage", "friendship"]),
    ("Pride and Prejudice", AUSTEN, ["love", "marriage", "family"]),
    ("Sense and Sensibility", AUSTEN, ["love", "sisters", "family"]),
    ("Persuasion", AUSTEN, ["love", "the sea", "second chances"]),
    ("Mansfield Park", AUSTEN, ["family", "marriage"]),
    ("Northanger Abbey", AUSTEN, ["novels", "friendship"]),
    ("Moby-Dick", MELVILLE, ["whales", "the sea", "ships"]),
    ("Typee", MELVILLE, ["islands", "the sea"]),
    ("Omoo", MELVILLE, ["islands", "ships"]),
    ("Billy Budd", MELVILLE, ["ships", "the sea", "justice"]),
    ("Bartleby, the Scrivener", MELVILLE, ["work", "offices"]),
    ("Hamlet", SHAKESPEARE, ["kings", "ghosts", "revenge", "family"]),
    ("Macbeth", SHAKESPEARE, ["kings", "witches", "ambition"]),
    ("King Lear", SHAKESPEARE, ["kings", "family", "sisters"]),
    ("Othello", SHAKESPEARE, ["jealousy", "love"]),
    ("The Tempest", SHAKESPEARE, ["islands", "the sea", "magic"]),
    ("Twelfth Night", SHAKESPEARE, ["love", "the sea", "twins"]),
    ("Romeo and Juliet", SHAKESPEARE, ["love", "family"]),
    ("A Midsummer Night's Dream", SHAKESPEARE, ["love", "magic"]),
]
AUTHORS = [AUSTEN, MELVILLE, SHAKESPEARE]
TOPICS = sorted({t for _, _, ts in BOOKS for t in ts})

NUMBER_WORDS = ["zero", "one", "two", "three", "four", "five"]

CURRENCIES = {"USD": 1.0, "EUR": 0.92, "GBP": 0.79, "JPY": 151.0, "CHF": 0.9, "CAD": 1.36, "AUD": 1.52,
              "INR": 83.0, "CNY": 7.2, "SEK": 10.5, "MXN": 17.0, "BRL": 5.0}

NAMES = ["Alice", "Bob", "Carol", "David", "Ellen", "Frank", "Grace", "Henry", "Irene", "Jack", "Kate", "Liam",
         "Mia", "Noah", "Olivia", "Paul", "Rosa", "Sam", "Tom", "Zoe"]
MESSAGES = ["I will be late", "See you at noon", "Happy birthday", "The meeting is on Friday",
            "Call me when you can", "Dinner is at seven", "Thank you for the book", "I am on my way",
            "Good luck with the exam", "The train leaves at nine"]

WORDS = {
    "serene": "calm and peaceful", "brave": "ready to face danger or pain", "ancient": "very old",
    "fragile": "easily broken", "generous": "happy to give more than is expected", "humble": "not proud",
    "curious": "eager to know or learn", "vast": "very large in size", "gloomy": "dark or sad",
    "swift": "moving very fast", "honest": "telling the truth", "rare": "not found very often",
    "eager": "wanting very much to do something", "harbor": "a sheltered place where ships stay",
    "voyage": "a long journey by sea", "whale": "a very large animal that lives in the sea",
    "meadow": "a field of grass and flowers", "lantern": "a lamp with a case around its light",
    "orchard": "a piece of land with fruit trees", "puzzle": "a game or problem that tests your thinking",
    "journey": "a trip from one place to another", "quarrel": "an angry argument",
    "courage": "the ability to face fear", "patience": "the ability to wait calmly",
    "whisper": "to speak very softly", "wander": "to walk without a fixed plan",
    "tempest": "a violent storm", "scrivener": "a person who copies documents by hand",
}

TASKS = ["call my mother", "take the cake out of the oven", "check the mail", "water the plants",
         "go for a walk", "drink some water", "join the meeting", "feed the cat", "read a chapter",
         "stretch my legs", "buy some bread", "send the report", "pick up the kids", "turn off the oven"]
MINUTES = [5, 10, 15, 20, 25, 30, 40, 45, 60, 90, 120]

SENTENCES = {
    "the sea": ["The sea is wide and deep, and its waves never rest.",
                "The sea shines blue under the morning sun."],
    "the moon": ["The moon hangs silver and quiet over the sleeping town.",
                 "The moon lights the night with a soft, pale glow."],
    "rain": ["The rain taps softly on the window all night long.",
             "After the rain, the whole street smells fresh and clean."],
    "the forest": ["The forest is green and quiet, full of tall old trees.",
                   "In the forest, birds sing high above the mossy ground."],
    "winter": ["Winter covers the fields in a thick blanket of snow.",
               "In winter the days are short and the nights are long and cold."],
    "cats": ["Cats sleep in warm sunny spots for most of the day.",
             "A cat can move so softly that you never hear it coming."],
    "a river": ["A river winds through the valley on its long way to the sea.",
                "The river runs fast and clear over the smooth stones."],
    "the city": ["The city never sleeps, and its streets are busy day and night.",
                 "At night the city glows with a thousand bright lights."],
    "music": ["Music can make a sad day feel a little brighter.",
              "Good music fills a room with life and joy."],
    "the sun": ["The sun rises in the east and warms the whole world.",
                "The sun sets slowly, painting the sky orange and red."],
    "books": ["A good book can take you to places you have never been.",
              "Books hold the thoughts of people from long ago."],
    "friendship": ["Friendship makes the good times better and the hard times easier.",
                   "A true friend stays with you in both sunshine and rain."],
    "mountains": ["The mountains stand tall and still, their tops white with snow.",
                  "High in the mountains, the air is cold and clean."],
    "spring": ["In spring the trees turn green and the flowers begin to bloom.",
               "Spring brings warm days, soft rain and singing birds."],
}

SYSTEMS = ["You are a helpful assistant.", "You are a helpful assistant. Answer briefly.",
           "You are a friendly assistant.", "Be concise.", "You are a helpful and honest assistant."]
SYSTEMS_TOOLS = SYSTEMS + ["You are a helpful assistant. Use the tools when they help.",
                           "You are an assistant with tools. Call a tool when you need fresh information."]


# ---------------------------------------------------------------------------------------------------------
# Helpers

def _join(items):
    items = list(items)
    if len(items) == 1:
        return items[0]
    return ", ".join(items[:-1]) + " and " + items[-1]


def _cap(s):
    return s[:1].upper() + s[1:]


def _num(x):
    """A number as the user and the JSON write it (json.dumps: 12, 12.5)."""
    return _dumps(x)


def _call_id(rng):
    return "call_%08x" % rng.getrandbits(32)


# ---------------------------------------------------------------------------------------------------------
# Tool scenarios. Each returns {"tools": [names], "user", "calls": [(name, args)], "results": [dict],
# "think1", "think2", "answer"}.

def _weather_values(rng, unit):
    if unit == "fahrenheit":
        t = rng.randint(23, 95)
        cold = t <= 34
    else:
        t = rng.randint(-5, 35)
        cold = t <= 1
    cond = rng.choice(CONDITIONS + ["snowy"] * 3) if cold else rng.choice(CONDITIONS)
    return t, cond


def scn_weather(rng):
    city = rng.choice(CITIES)
    unit = rng.choice([None, None, None, "celsius", "fahrenheit"])
    if unit is None:
        user = rng.choice(["What is the weather in {c}?", "What's the weather like in {c} today?",
                           "How is the weather in {c}?", "Tell me the weather in {c}.",
                           "Can you check the weather in {c}?", "Weather in {c}, please.",
                           "I am going out in {c}. What is the weather like?"]).format(c=city)
        args = {"city": city}
        think1 = rng.choice(["The user wants the weather in {c}. I will call get_weather.",
                             "The user asks about the weather in {c}. I should use get_weather for {c}."]
                            ).format(c=city)
    else:
        user = rng.choice(["What is the weather in {c} in {u}?", "Tell me the weather in {c}, in {u}.",
                           "How warm is it in {c}? Give me the temperature in {u}.",
                           "Check the weather in {c} and use {u}."]).format(c=city, u=unit)
        args = {"city": city, "unit": unit}
        think1 = rng.choice(["The user wants the weather in {c} in {u}. I will call get_weather with unit {u}.",
                             "The user asks about the weather in {c} and wants {u}. I will call get_weather."]
                            ).format(c=city, u=unit)
    t, cond = _weather_values(rng, unit)
    sym = "°F" if unit == "fahrenheit" else "°C"
    result = {"city": city, "temperature": t, "unit": unit or "celsius", "condition": cond}
    think2 = "The tool says it is {t} degrees and {w} in {c}.".format(t=t, w=cond, c=city)
    answer = rng.choice(["It is {t} {s} and {w} in {c} right now.", "Right now it is {w} in {c}, at {t} {s}.",
                         "The weather in {c} is {w}, with a temperature of {t} {s}."]
                        ).format(t=t, s=sym, w=cond, c=city)
    return {"tools": ["get_weather"], "user": user, "calls": [("get_weather", args)], "results": [result],
            "think1": think1, "think2": think2, "answer": answer}


def _clock(rng):
    return "%02d:%02d" % (rng.randint(0, 23), rng.choice(range(0, 60, 5)))


def scn_time(rng):
    city = rng.choice(CITIES)
    user = rng.choice(["What time is it in {c}?", "What is the local time in {c}?", "Tell me the time in {c}.",
                       "What's the time in {c} right now?", "Do you know what time it is in {c}?"]).format(c=city)
    time = _clock(rng)
    return {"tools": ["get_time"], "user": user, "calls": [("get_time", {"city": city})],
            "results": [{"city": city, "time": time}],
            "think1": rng.choice(["The user wants the local time in {c}. I will call get_time.",
                                  "The user asks what time it is in {c}. I should use get_time."]).format(c=city),
            "think2": "The tool says it is {t} in {c}.".format(t=time, c=city),
            "answer": rng.choice(["It is {t} in {c}.", "The local time in {c} is {t}.",
                                  "Right now it is {t} in {c}."]).format(t=time, c=city)}


def scn_books(rng):
    n = rng.choice([None, None, 1, 2, 3, 3, 4])
    if rng.random() < 0.5:
        author = rng.choice(AUTHORS)
        query = author
        matches = [b for b in BOOKS if b[1] == author]
        what = "books by " + author
        if n is None:
            user = rng.choice(["Search for books by {a}.", "Find books by {a}.", "What books did {a} write?",
                               "Can you look up books by {a}?"]).format(a=author)
        else:
            user = rng.choice(["Find {n} books by {a}.", "Search for books by {a}, at most {n}.",
                               "Show me {n} books by {a}."]).format(a=author, n=n)
    else:
        topic = rng.choice(TOPICS)
        query = topic
        matches = [b for b in BOOKS if topic in b[2]]
        what = "books about " + topic
        if n is None:
            user = rng.choice(["Can you find books about {t}?", "Search for books about {t}.",
                               "I want to read something about {t}. Find me some books.",
                               "Are there any good books about {t}?"]).format(t=topic)
        else:
            user = rng.choice(["Show me {n} books about {t}.", "Find {n} books about {t}.",
                               "Search for books about {t}, at most {n}."]).format(t=topic, n=n)
    args = {"query": query}
    if n is not None:
        args["max_results"] = n
    found = rng.sample(matches, len(matches))[:n or 3]
    result = {"results": [{"title": b[0], "author": b[1]} for b in found]}
    think1 = "The user wants {w}. I will call search_books".format(w=what)
    think1 += " with max_results {n}.".format(n=n) if n is not None else "."
    titles = [b[0] for b in found]
    count = NUMBER_WORDS[len(found)] if len(found) < len(NUMBER_WORDS) else str(len(found))
    think2 = "The tool found {k} book{s}: {l}.".format(k=count, s="" if len(found) == 1 else "s", l=_join(titles))
    if query in AUTHORS:
        answer = rng.choice(["Here are some books by {a}: {l}.", "{a} wrote {l}."]).format(a=query, l=_join(titles))
        if len(found) == 1:
            answer = "I found one book by {a}: {l}.".format(a=query, l=titles[0])
    else:
        listed = _join("{t} by {a}".format(t=b[0], a=b[1]) for b in found)
        answer = ("I found one book about {q}: {l}." if len(found) == 1 else "Here are some books about {q}: {l}."
                  ).format(q=query, l=listed)
    return {"tools": ["search_books"], "user": user, "calls": [("search_books", args)], "results": [result],
            "think1": think1, "think2": think2, "answer": answer}


def scn_calculate(rng):
    form = rng.random()
    if form < 0.3:
        a, b = rng.randint(10, 999), rng.randint(10, 999)
        expr, value = "{} + {}".format(a, b), a + b
    elif form < 0.5:
        a, b = rng.randint(10, 999), rng.randint(10, 999)
        expr, value = "{} - {}".format(a, b), a - b
    elif form < 0.75:
        a, b = rng.randint(2, 99), rng.randint(2, 99)
        expr, value = "{} * {}".format(a, b), a * b
    elif form < 0.9:
        b, q = rng.randint(2, 40), rng.randint(2, 60)
        expr, value = "{} / {}".format(b * q, b), q
    else:
        a, b, c = rng.randint(2, 50), rng.randint(2, 50), rng.randint(2, 12)
        expr, value = "({} + {}) * {}".format(a, b, c), (a + b) * c
    user = rng.choice(["Calculate {e}.", "What is {e}? Use the calculator.", "Please compute {e}.",
                       "Can you work out {e} for me?", "How much is {e}?"]).format(e=expr)
    return {"tools": ["calculate"], "user": user, "calls": [("calculate", {"expression": expr})],
            "results": [{"result": value}],
            "think1": rng.choice(["The user wants me to calculate {e}. I will call calculate.",
                                  "The user asks for {e}. I will use the calculate tool."]).format(e=expr),
            "think2": "The tool says {e} is {v}.".format(e=expr, v=value),
            "answer": rng.choice(["{e} = {v}.", "The result of {e} is {v}.", "{e} is {v}."]).format(e=expr, v=value)}


def scn_currency(rng):
    src, dst = rng.sample(sorted(CURRENCIES), 2)
    amount = rng.choice([rng.choice([5, 10, 20, 25, 50, 75, 100, 150, 200, 250, 500, 1000, 2000]),
                         rng.randint(1, 999), rng.randint(1, 999) + rng.choice([0.5, 0.25, 0.75, 0.99])])
    converted = round(amount * CURRENCIES[dst] / CURRENCIES[src], 2)
    a, r = _num(amount), _num(converted)
    user = rng.choice(["Convert {a} {f} to {t}.", "How much is {a} {f} in {t}?", "What is {a} {f} in {t}?",
                       "Change {a} {f} into {t}, please.", "I have {a} {f}. How much is that in {t}?"]
                      ).format(a=a, f=src, t=dst)
    return {"tools": ["convert_currency"], "user": user,
            "calls": [("convert_currency", {"amount": amount, "from_currency": src, "to_currency": dst})],
            "results": [{"amount": amount, "from_currency": src, "to_currency": dst, "result": converted}],
            "think1": "The user wants to convert {a} {f} to {t}. I will call convert_currency.".format(
                a=a, f=src, t=dst),
            "think2": "The tool says {a} {f} is {r} {t}.".format(a=a, f=src, r=r, t=dst),
            "answer": rng.choice(["{a} {f} is about {r} {t}.", "That is about {r} {t}."]).format(
                a=a, f=src, r=r, t=dst)}


def scn_message(rng):
    to, text = rng.choice(NAMES), rng.choice(MESSAGES)
    user = rng.choice(["Send a message to {n} saying {m}.", "Text {n}: {m}.", "Please send {n} this message: {m}.",
                       "Message {n} and say {m}."]).format(n=to, m=text)
    return {"tools": ["send_message"], "user": user, "calls": [("send_message", {"to": to, "text": text})],
            "results": [{"status": "sent", "to": to}],
            "think1": "The user wants to send {n} the message \"{m}\". I will call send_message.".format(n=to, m=text),
            "think2": "The tool says the message to {n} was sent.".format(n=to),
            "answer": rng.choice(["Your message to {n} has been sent.", "Done. I sent \"{m}\" to {n}."]).format(
                n=to, m=text)}


def scn_define(rng):
    word = rng.choice(sorted(WORDS))
    meaning = WORDS[word]
    user = rng.choice(["What does {w} mean?", "Define the word {w}.", "What is the meaning of {w}?",
                       "Look up the word {w} for me.", "What does the word {w} mean?"]).format(w=word)
    return {"tools": ["define_word"], "user": user, "calls": [("define_word", {"word": word})],
            "results": [{"word": word, "definition": meaning}],
            "think1": rng.choice(["The user wants the meaning of {w}. I will call define_word.",
                                  "The user asks what {w} means. I should look it up with define_word."]
                                 ).format(w=word),
            "think2": "The tool says {w} means {d}.".format(w=word, d=meaning),
            "answer": rng.choice(["{W} means {d}.", "The word {w} means {d}."]).format(W=_cap(word), w=word,
                                                                                      d=meaning)}


def scn_reminder(rng):
    task, minutes = rng.choice(TASKS), rng.choice(MINUTES)
    user = rng.choice(["Remind me to {t} in {m} minutes.", "Set a reminder to {t} in {m} minutes.",
                       "In {m} minutes, remind me to {t}.", "Please remind me in {m} minutes to {t}."]
                      ).format(t=task, m=minutes)
    mine = task.replace("my ", "your ")
    return {"tools": ["set_reminder"], "user": user, "calls": [("set_reminder", {"text": task, "minutes": minutes})],
            "results": [{"status": "ok", "minutes": minutes}],
            "think1": "The user wants a reminder to {t} in {m} minutes. I will call set_reminder.".format(
                t=task, m=minutes),
            "think2": "The tool says the reminder is set for {m} minutes from now.".format(m=minutes),
            "answer": rng.choice(["Done. I will remind you to {t} in {m} minutes.",
                                  "Your reminder to {t} is set for {m} minutes from now."]).format(t=mine, m=minutes)}


def scn_weather_two(rng):
    c1, c2 = rng.sample(CITIES, 2)
    (t1, w1), (t2, w2) = _weather_values(rng, None), _weather_values(rng, None)
    user = rng.choice(["What is the weather in {a} and {b}?", "Compare the weather in {a} and {b}.",
                       "How is the weather in {a} and in {b}?"]).format(a=c1, b=c2)
    return {"tools": ["get_weather"], "user": user,
            "calls": [("get_weather", {"city": c1}), ("get_weather", {"city": c2})],
            "results": [{"city": c1, "temperature": t1, "unit": "celsius", "condition": w1},
                        {"city": c2, "temperature": t2, "unit": "celsius", "condition": w2}],
            "think1": "The user wants the weather in {a} and {b}. I will call get_weather for each city.".format(
                a=c1, b=c2),
            "think2": "The tool says it is {t1} degrees and {w1} in {a}, and {t2} degrees and {w2} in {b}.".format(
                t1=t1, w1=w1, a=c1, t2=t2, w2=w2, b=c2),
            "answer": "It is {t1} °C and {w1} in {a}, and {t2} °C and {w2} in {b}.".format(
                t1=t1, w1=w1, a=c1, t2=t2, w2=w2, b=c2)}


def scn_time_two(rng):
    c1, c2 = rng.sample(CITIES, 2)
    h1, h2 = _clock(rng), _clock(rng)
    user = rng.choice(["What time is it in {a} and in {b}?", "Tell me the time in {a} and {b}."]).format(a=c1, b=c2)
    return {"tools": ["get_time"], "user": user,
            "calls": [("get_time", {"city": c1}), ("get_time", {"city": c2})],
            "results": [{"city": c1, "time": h1}, {"city": c2, "time": h2}],
            "think1": "The user wants the local time in {a} and {b}. I will call get_time for each city.".format(
                a=c1, b=c2),
            "think2": "The tool says it is {x} in {a} and {y} in {b}.".format(x=h1, a=c1, y=h2, b=c2),
            "answer": "It is {x} in {a} and {y} in {b}.".format(x=h1, a=c1, y=h2, b=c2)}


def scn_weather_time(rng):
    city = rng.choice(CITIES)
    t, w = _weather_values(rng, None)
    h = _clock(rng)
    user = rng.choice(["What is the weather and the time in {c}?", "Tell me the time and the weather in {c}."]
                      ).format(c=city)
    return {"tools": ["get_weather", "get_time"], "user": user,
            "calls": [("get_weather", {"city": city}), ("get_time", {"city": city})],
            "results": [{"city": city, "temperature": t, "unit": "celsius", "condition": w},
                        {"city": city, "time": h}],
            "think1": "The user wants the weather and the time in {c}. I will call get_weather and get_time.".format(
                c=city),
            "think2": "The tools say it is {t} degrees and {w} in {c}, and the time is {h}.".format(
                t=t, w=w, c=city, h=h),
            "answer": "In {c} it is {h} now, {t} °C and {w}.".format(c=city, h=h, t=t, w=w)}


SINGLE_SCENARIOS = [scn_weather, scn_time, scn_books, scn_calculate, scn_currency, scn_message, scn_define,
                    scn_reminder]
DOUBLE_SCENARIOS = [scn_weather_two, scn_weather_two, scn_time_two, scn_weather_time]


# ---------------------------------------------------------------------------------------------------------
# Plain question / answer items: (user, reasoning, answer)

def qa_greeting(rng, tools=None):
    user, answer = rng.choice([
        ("Hello!", "Hello! How can I help you today?"), ("Hi there.", "Hi! How can I help you today?"),
        ("Good morning!", "Good morning! How can I help you today?"),
        ("Hey, how are you?", "I am fine, thank you. How can I help you?"),
        ("Hello, who are you?", "I am an AI assistant. How can I help you today?"),
        ("Good evening.", "Good evening! What can I do for you?")])
    think = "The user greets me."
    if tools:
        think += " No tool is needed."
    return user, think + " I will greet them back.", answer


def qa_thanks(rng, tools=None):
    user, answer = rng.choice([
        ("Thank you!", "You are welcome."), ("Thanks a lot.", "You are welcome! Have a nice day."),
        ("Thanks, that is all.", "You are welcome. Have a nice day!"), ("Goodbye!", "Goodbye! Have a nice day."),
        ("Great, thanks!", "You are welcome.")])
    think = "The user says goodbye." if user == "Goodbye!" else "The user thanks me."
    if tools:
        think += " No tool is needed."
    return user, think + " I will answer politely.", answer


def qa_ability(rng, tools):
    names = [t["function"]["name"] for t in tools]
    user = rng.choice(["What can you do?", "What can you help me with?", "Which tools do you have?"])
    return (user, "The user asks what I can do. I will list what my tools can do.",
            "I can {l}. Just ask!".format(l=_join(TOOL_ABILITY[n] for n in names)))


def qa_sentence(rng, tools=None):
    topic = rng.choice(sorted(SENTENCES))
    user = rng.choice(["Write one sentence about {t}.", "Give me a sentence about {t}.",
                       "Say something about {t} in one sentence.", "Write a short sentence about {t}."]
                      ).format(t=topic)
    think = "The user wants one sentence about {t}.".format(t=topic)
    if tools:
        think += " No tool is needed."
    return user, think + " I will write a short one.", rng.choice(SENTENCES[topic])


def qa_arithmetic(rng, tools=None):
    op = rng.choice(["plus", "minus", "times"])
    if op == "plus":
        a, b = rng.randint(1, 99), rng.randint(1, 99)
        v = a + b
    elif op == "minus":
        a, b = rng.randint(2, 99), rng.randint(1, 99)
        a, b = max(a, b), min(a, b)
        v = a - b
    else:
        a, b = rng.randint(2, 12), rng.randint(2, 12)
        v = a * b
    user = rng.choice(["What is {a} {o} {b}?", "How much is {a} {o} {b}?", "Quick question: what is {a} {o} {b}?"]
                      ).format(a=a, o=op, b=b)
    return (user, "The user asks for {a} {o} {b}. {a} {o} {b} is {v}.".format(a=a, o=op, b=b, v=v),
            "{a} {o} {b} is {v}.".format(a=a, o=op, b=b, v=v))


def qa_author(rng, tools=None):
    title, author, _ = rng.choice(BOOKS)
    if rng.random() < 0.7:
        user = rng.choice(["Who wrote {t}?", "Who is the author of {t}?", "Do you know who wrote {t}?"]).format(t=title)
        return (user, "The user asks who wrote {t}. It was written by {a}.".format(t=title, a=author),
                rng.choice(["{t} was written by {a}.", "{a} wrote {t}."]).format(t=title, a=author))
    titles = [b[0] for b in BOOKS if b[1] == author]
    picked = rng.sample(titles, 2)
    user = "Name two books by {a}.".format(a=author)
    return (user, "The user wants two books by {a}. {a} wrote {x} and {y}.".format(a=author, x=picked[0], y=picked[1]),
            "Two books by {a} are {x} and {y}.".format(a=author, x=picked[0], y=picked[1]))


def qa_word(rng, tools=None):
    word = rng.choice(sorted(WORDS))
    user = rng.choice(["What does {w} mean?", "What is the meaning of {w}?"]).format(w=word)
    return (user, "The user asks what {w} means. It means {d}.".format(w=word, d=WORDS[word]),
            "{W} means {d}.".format(W=_cap(word), d=WORDS[word]))


# ---------------------------------------------------------------------------------------------------------
# Conversations

KIND_WEIGHTS = [("tool_think", 35), ("tool_chat", 20), ("tool_unneeded", 15), ("no_tools", 30)]
MAX_CHARS = 4000


def _tool_list(rng, needed, extra_max=3):
    others = [n for n in TOOL_BY_NAME if n not in needed]
    names = list(needed) + rng.sample(others, rng.randint(0, extra_max))
    rng.shuffle(names)
    return [TOOL_BY_NAME[n] for n in names]


def _assistant(thinking, content, reasoning=None, tool_calls=None):
    m = {"role": "assistant", "content": content}
    if thinking:
        m["reasoning_content"] = reasoning
    if tool_calls is not None:
        m["tool_calls"] = tool_calls
    return m


def _system(rng, messages, tools):
    if rng.random() < 0.3:
        messages.append({"role": "system", "content": rng.choice(SYSTEMS_TOOLS if tools else SYSTEMS)})


def _conv_tool_call(rng, thinking, extra_max=3):
    scn = rng.choice(DOUBLE_SCENARIOS)(rng) if rng.random() < 0.1 else rng.choice(SINGLE_SCENARIOS)(rng)
    tools = _tool_list(rng, scn["tools"], extra_max)
    messages = []
    _system(rng, messages, tools)
    messages.append({"role": "user", "content": scn["user"]})
    calls = [{"id": _call_id(rng), "type": "function", "function": {"name": name, "arguments": _dumps(args)}}
             for name, args in scn["calls"]]
    messages.append(_assistant(thinking, "", scn["think1"], calls))
    results = [{"role": "tool", "tool_call_id": call["id"], "content": _dumps(result)}
               for call, result in zip(calls, scn["results"])]
    if len(results) > 1 and rng.random() < 0.3:
        results.reverse()  # the encoder puts them back in call order
    messages.extend(results)
    messages.append(_assistant(thinking, scn["answer"], scn["think2"]))
    if rng.random() < 0.1:
        user, think, answer = qa_thanks(rng, tools)
        messages.append({"role": "user", "content": user})
        messages.append(_assistant(thinking, answer, think))
    return messages, tools


def _conv_unneeded(rng, thinking, extra_max=3):
    tools = [TOOL_BY_NAME[n] for n in rng.sample(list(TOOL_BY_NAME), rng.randint(1, 1 + extra_max))]
    messages = []
    _system(rng, messages, tools)
    r = rng.random()
    if r < 0.35:
        user, think, answer = qa_greeting(rng, tools)
    elif r < 0.6:
        user, think, answer = qa_thanks(rng, tools)
    elif r < 0.8:
        user, think, answer = qa_ability(rng, tools)
    else:
        user, think, answer = qa_sentence(rng, tools)
    messages.append({"role": "user", "content": user})
    messages.append(_assistant(thinking, answer, think))
    return messages, tools


QA_ITEMS = [(qa_greeting, 2), (qa_arithmetic, 3), (qa_author, 3), (qa_sentence, 3), (qa_word, 1), (qa_thanks, 1)]


def _qa_item(rng):
    return rng.choices([f for f, _ in QA_ITEMS], weights=[w for _, w in QA_ITEMS])[0](rng)


def _conv_no_tools(rng, thinking):
    messages = []
    _system(rng, messages, None)
    turns = [_qa_item(rng)]
    if rng.random() < 0.2:
        first = qa_greeting(rng) if rng.random() < 0.4 else _qa_item(rng)
        second = qa_thanks(rng) if rng.random() < 0.3 else _qa_item(rng)
        turns = [first, second]
    for user, think, answer in turns:
        messages.append({"role": "user", "content": user})
        messages.append(_assistant(thinking, answer, think))
    return messages, None


def conversation(rng, kind):
    """One conversation of the given kind; a too long one is drawn again with fewer extra tools."""
    for extra_max in (3, 2, 1, 0, 0, 0):
        if kind == "tool_think":
            thinking = True
            messages, tools = _conv_tool_call(rng, thinking, extra_max)
        elif kind == "tool_chat":
            thinking = False
            messages, tools = _conv_tool_call(rng, thinking, extra_max)
        elif kind == "tool_unneeded":
            thinking = rng.random() < 0.6
            messages, tools = _conv_unneeded(rng, thinking, extra_max)
        else:
            thinking = rng.random() < 0.5
            messages, tools = _conv_no_tools(rng, thinking)
        conv = {"messages": messages, "tools": tools, "thinking": thinking, "kind": kind}
        if len(render(conv)) <= MAX_CHARS:
            return conv
    raise RuntimeError("could not draw a conversation under %d characters" % MAX_CHARS)


def conversations(n, seed):
    rng = random.Random(seed)
    kinds = [k for k, _ in KIND_WEIGHTS]
    weights = [w for _, w in KIND_WEIGHTS]
    return [conversation(rng, rng.choices(kinds, weights=weights)[0]) for _ in range(n)]


# ---------------------------------------------------------------------------------------------------------
# Statistics

def _percentile(sorted_values, p):
    if not sorted_values:
        return 0
    k = min(len(sorted_values) - 1, max(0, int(round(p / 100.0 * (len(sorted_values) - 1)))))
    return sorted_values[k]


def _describe(values):
    v = sorted(values)
    return "p10 %d  p50 %d  p90 %d  p99 %d  max %d  mean %.0f" % (
        _percentile(v, 10), _percentile(v, 50), _percentile(v, 90), _percentile(v, 99), v[-1], sum(v) / len(v))


def print_stats(convs, texts, token_counts=None):
    n = len(convs)
    print("conversations: %d" % n)
    print("chars:  " + _describe([len(t) for t in texts]))
    if token_counts:
        print("tokens: " + _describe(token_counts))
    counts = {}
    for c in convs:
        counts[c["kind"]] = counts.get(c["kind"], 0) + 1
    for kind, _ in KIND_WEIGHTS:
        print("  %-14s %6d  %5.1f%%" % (kind, counts.get(kind, 0), 100.0 * counts.get(kind, 0) / max(n, 1)))

    def share(pred):
        return "%5.1f%%" % (100.0 * sum(1 for c in convs if pred(c)) / max(n, 1))

    def calls(c):
        return [m for m in c["messages"] if m.get("tool_calls")]

    print("  thinking mode          " + share(lambda c: c["thinking"]))
    print("  with tools             " + share(lambda c: c["tools"]))
    print("  with a tool call       " + share(lambda c: calls(c)))
    print("  two calls in one turn  " + share(lambda c: any(len(m["tool_calls"]) > 1 for m in calls(c))))
    print("  two or more user turns " + share(lambda c: sum(1 for m in c["messages"] if m["role"] == "user") > 1))
    print("  with a system message  " + share(lambda c: c["messages"][0]["role"] == "system"))
    used = {}
    for c in convs:
        for m in calls(c):
            for call in m["tool_calls"]:
                used[call["function"]["name"]] = used.get(call["function"]["name"], 0) + 1
    print("  calls per tool: " + ", ".join("%s %d" % (k, used.get(k, 0)) for k in TOOL_BY_NAME))


# ---------------------------------------------------------------------------------------------------------
# Engine tokenizer and server

def cli_tokenize(texts, dsv4, tokenizer):
    """Token ids of each text from `dsv4 tokenize --jsonl` (special-token strings recognised)."""
    data = "".join(_dumps(t) + "\n" for t in texts).encode("utf-8")
    proc = subprocess.run([dsv4, "tokenize", "--tokenizer", tokenizer, "--jsonl"], input=data,
                          stdout=subprocess.PIPE, check=True)
    lines = proc.stdout.decode("utf-8").splitlines()
    assert len(lines) == len(texts), (len(lines), len(texts))
    return [json.loads(line) for line in lines]


def _http(url, body=None):
    data = None if body is None else json.dumps(body, ensure_ascii=False).encode("utf-8")
    req = urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"} if data else {})
    try:
        with urllib.request.urlopen(req, timeout=120) as resp:
            return json.loads(resp.read().decode("utf-8"))
    except urllib.error.HTTPError as e:
        raise RuntimeError("%s -> HTTP %d: %s" % (url, e.code, e.read().decode("utf-8", "replace"))) from None


def request_body(conv, model):
    """The /tokenize request for conv: the last (assistant) message marked as a prefix, so that the server
    accepts it; the encoder then leaves out only that message's EOS."""
    messages = [dict(m) for m in conv["messages"]]
    messages[-1]["prefix"] = True
    body = {"model": model, "messages": messages, "chat_template_kwargs": {"thinking": conv["thinking"]}}
    if conv["tools"]:
        body["tools"] = conv["tools"]
    return body


def _first_diff(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b)) if len(a) != len(b) else -1


def check(url, convs, dsv4, tokenizer):
    url = url.rstrip("/")
    model = _http(url + "/v1/models")["data"][0]["id"]
    texts = [render(c) for c in convs]
    for i, t in enumerate(texts):
        assert t.endswith(EOS), i
    eos_ids = cli_tokenize([EOS], dsv4, tokenizer)[0]
    assert len(eos_ids) == 1, eos_ids
    expected = cli_tokenize(texts, dsv4, tokenizer)
    bad = 0
    for i, (conv, text, want) in enumerate(zip(convs, texts, expected)):
        problems = []
        try:
            got = _http(url + "/tokenize", request_body(conv, model))["tokens"]
        except RuntimeError as e:
            problems.append(str(e))
            got = None
        if got is not None:
            got_full = got + eos_ids
            k = _first_diff(want, got_full)
            if k >= 0:
                problems.append("token ids differ at position %d of %d (render) / %d (server + EOS):\n"
                                "    render: ...%s\n    server: ...%s" % (k, len(want), len(got_full),
                                                                          want[max(0, k - 8):k + 8],
                                                                          got_full[max(0, k - 8):k + 8]))
            server_text = _http(url + "/detokenize", {"model": model, "tokens": got})["prompt"] + EOS
            c = _first_diff(text, server_text)
            if c >= 0:
                problems.append("text differs at character %d of %d (render) / %d (server):\n"
                                "    render: %s\n    server: %s" % (c, len(text), len(server_text),
                                                                   _dumps(text[max(0, c - 60):c + 60]),
                                                                   _dumps(server_text[max(0, c - 60):c + 60])))
        if problems:
            bad += 1
            print("MISMATCH conversation %d (%s, thinking %s, %d messages):" % (
                i, conv["kind"], conv["thinking"], len(conv["messages"])))
            for p in problems:
                print("  " + p)
    lengths = sorted(len(ids) for ids in expected)
    print("checked %d conversations against %s (model %s): %d mismatches; tokens p50 %d p90 %d max %d" % (
        len(convs), url, model, bad, _percentile(lengths, 50), _percentile(lengths, 90), lengths[-1]))
    return bad


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--n", type=int, default=1000, help="number of conversations")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", help="write {\"text\": ...} JSON lines here (.gz: gzip-compressed)")
    ap.add_argument("--stats", action="store_true", help="print length percentiles and the mix of kinds")
    ap.add_argument("--token-stats", action="store_true", help="with --stats: token lengths from the engine's CLI")
    ap.add_argument("--check", metavar="URL", help="compare render() with a running dsv4 serve's /tokenize")
    ap.add_argument("--dsv4", default=os.path.join(REPO, "build", "bin", "dsv4"), help="the engine's binary")
    ap.add_argument("--tokenizer", default=os.path.join(REPO, "models", "small", "tokenizer.json"))
    args = ap.parse_args(argv)
    if not (args.out or args.stats or args.check):
        ap.error("give --out, --stats and / or --check")

    convs = conversations(args.n, args.seed)
    texts = [render(c) for c in convs]
    if args.out:
        opener = gzip.open if args.out.endswith(".gz") else open
        with opener(args.out, "wt", encoding="utf-8", newline="\n") as f:
            for t in texts:
                f.write(_dumps({"text": t}) + "\n")
        print("wrote %d conversations to %s" % (len(texts), args.out), file=sys.stderr)
    if args.stats:
        tokens = None
        if args.token_stats:
            tokens = [len(ids) for ids in cli_tokenize(texts, args.dsv4, args.tokenizer)]
        print_stats(convs, texts, tokens)
    if args.check:
        if check(args.check, convs, args.dsv4, args.tokenizer):
            return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
