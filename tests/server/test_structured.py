"""Constrained decoding through `dsv4 serve` with the official `openai` and `anthropic` clients, on the shipped tiny
model on the CPU: response_format json_schema / json_object, tool_choice required / named (OpenAI) and any / tool
(Anthropic), output_config.format. The tiny model was never taught JSON or DSML, and it samples at temperature 1.0
here: every answer must still parse and validate (checked below by a small validator of the schema subset the
server supports).

Run by ctest (tests/server/tests.cmake) with the venv that tools/setup makes:
    DSV4_CLI=build/bin/dsv4 build/venv/bin/python -m unittest -v tests/server/test_structured.py
"""

import json
import unittest

import openai

from test_anthropic import client_for, user
from test_openai import MODEL, ServerCase, chat

PERSON = {
    "type": "object", "additionalProperties": False,
    "properties": {
        "name": {"type": "string", "minLength": 1, "maxLength": 20},
        "age": {"type": "integer"},
        "married": {"type": "boolean"},
        "mood": {"enum": ["happy", "sad", "vexed"]},
        "friends": {"type": "array", "items": {"type": "string", "maxLength": 12}, "maxItems": 3},
        "spouse": {"anyOf": [{"$ref": "#/$defs/partner"}, {"type": "null"}]},
    },
    "required": ["name", "age", "married", "mood", "friends"],
    "$defs": {"partner": {"type": "object", "properties": {"name": {"type": "string", "maxLength": 10}},
                          "required": ["name"], "additionalProperties": False}},
}
WEATHER = {"type": "object", "additionalProperties": False,
           "properties": {"town": {"type": "string", "maxLength": 12}, "days": {"type": "integer"},
                          "unit": {"enum": ["celsius", "fahrenheit"]}},
           "required": ["town", "unit"]}
TIME = {"type": "object", "properties": {"zone": {"type": "string", "maxLength": 8}}, "required": ["zone"],
        "additionalProperties": False}
TOOLS = [{"type": "function", "function": {"name": "get_weather", "description": "Weather", "parameters": WEATHER}},
         {"type": "function", "function": {"name": "get_time", "description": "Time", "parameters": TIME}}]
PARAMETERS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


def check(value, schema, root=None, path="$"):
    """Raises AssertionError naming the path where `value` breaks `schema` (the subset the server supports)."""
    root = root or schema
    if schema is True or schema == {}:
        return
    if "$ref" in schema:
        target = root
        for part in schema["$ref"].lstrip("#/").split("/"):
            target = target[part] if part else target
        return check(value, target, root, path)
    for keyword in ("anyOf", "oneOf"):
        if keyword in schema:
            passed = 0
            for alternative in schema[keyword]:
                try:
                    check(value, alternative, root, path)
                    passed += 1
                except AssertionError:
                    pass
            assert passed >= 1 and (keyword == "anyOf" or passed == 1), f"{path}: {value!r} fails {keyword}"
            return
    if "enum" in schema:
        assert value in schema["enum"], f"{path}: {value!r} not in {schema['enum']}"
    if "const" in schema:
        assert value == schema["const"], f"{path}: {value!r} is not {schema['const']!r}"
    types = schema.get("type")
    if types is not None:
        types = types if isinstance(types, list) else [types]
        kinds = {"string": str, "boolean": bool, "null": type(None), "object": dict, "array": list}
        ok = any((t == "integer" and isinstance(value, int) and not isinstance(value, bool)) or
                 (t == "number" and isinstance(value, (int, float)) and not isinstance(value, bool)) or
                 (t in kinds and isinstance(value, kinds[t])) for t in types)
        assert ok, f"{path}: {value!r} is not of type {types}"
    if isinstance(value, str):
        assert schema.get("minLength", 0) <= len(value) <= schema.get("maxLength", len(value)), \
            f"{path}: length {len(value)} of {value!r}"
    if isinstance(value, list):
        assert schema.get("minItems", 0) <= len(value) <= schema.get("maxItems", len(value)), \
            f"{path}: {len(value)} items"
        for i, item in enumerate(value):
            check(item, schema.get("items", True), root, f"{path}[{i}]")
    if isinstance(value, dict):
        properties = schema.get("properties", {})
        for name in schema.get("required", []):
            assert name in value, f"{path}: '{name}' is missing"
        for name, item in value.items():
            if name in properties:
                check(item, properties[name], root, f"{path}.{name}")
            else:
                extra = schema.get("additionalProperties", True)
                assert extra is not False, f"{path}: '{name}' is not allowed"
                check(item, extra, root, f"{path}.{name}")


def response_format(schema, name="answer"):
    return {"type": "json_schema", "json_schema": {"name": name, "schema": schema}}


class TestStructuredOutput(ServerCase):
    """Sampled answers (temperature 1.0, several seeds) always parse and validate; fields it cannot honour are
    refused."""
    server_args = ("--max-seqs", "8")

    def test_json_schema_answers_validate(self):
        answers = []
        for seed in (1, 2):
            r = self.client.chat.completions.create(
                model=MODEL, messages=chat("Describe a character."), temperature=1.0, seed=seed, n=4,
                max_tokens=400, response_format=response_format(PERSON))
            answers += [(c.finish_reason, c.message.content) for c in r.choices]
        # Streamed (two choices interleaved) and greedy (the row still goes through the mask on the host).
        stream = self.client.chat.completions.create(
            model=MODEL, messages=chat("Describe a character."), temperature=1.0, seed=3, n=2, max_tokens=400,
            response_format=response_format(PERSON), stream=True)
        texts, reasons = ["", ""], ["", ""]
        for chunk in stream:
            for c in chunk.choices:
                texts[c.index] += c.delta.content or ""
                reasons[c.index] = c.finish_reason or reasons[c.index]
        answers += list(zip(reasons, texts))
        greedy = self.client.chat.completions.create(model=MODEL, messages=chat("Who is she?"), temperature=0,
                                                     max_tokens=400, response_format=response_format(PERSON))
        answers.append((greedy.choices[0].finish_reason, greedy.choices[0].message.content))
        for reason, text in answers:
            with self.subTest(text=text):
                self.assertEqual(reason, "stop")
                check(json.loads(text), PERSON)

    def test_json_object(self):
        # Any object: the tiny model writes prose into its free keys and values and seldom closes them, so an answer
        # may run to max_tokens; one that ends is an object.
        r = self.client.chat.completions.create(model=MODEL, messages=chat("Give me a JSON object."), temperature=1.0,
                                                seed=7, n=2, max_tokens=200,
                                                response_format={"type": "json_object"})
        for c in r.choices:
            self.assertTrue(c.message.content.startswith("{"))
            if c.finish_reason == "stop":
                self.assertIsInstance(json.loads(c.message.content), dict)
            else:
                self.assertEqual(c.finish_reason, "length")

    def assert_calls(self, calls, names):
        self.assertGreaterEqual(len(calls), 1)
        for call in calls:
            self.assertIn(call.function.name, names)
            check(json.loads(call.function.arguments), PARAMETERS[call.function.name])

    def test_tool_choice_required_and_named(self):
        ask = chat("What is the weather in Bath?")
        r = self.client.chat.completions.create(model=MODEL, messages=ask, tools=TOOLS, tool_choice="required",
                                                parallel_tool_calls=False, temperature=1.0, seed=11, n=3,
                                                max_tokens=500)
        for c in r.choices:
            self.assertEqual(c.finish_reason, "tool_calls")
            self.assertIsNone(c.message.content)
            self.assertEqual(len(c.message.tool_calls), 1)
            self.assert_calls(c.message.tool_calls, {"get_weather", "get_time"})
        # Parallel calls allowed: every call the answer completes is valid (the last may be cut by max_tokens).
        r = self.client.chat.completions.create(model=MODEL, messages=ask, tools=TOOLS, tool_choice="required",
                                                temperature=1.0, seed=12, max_tokens=800)
        c = r.choices[0]
        self.assert_calls(c.message.tool_calls[:-1] if c.finish_reason == "length" else c.message.tool_calls,
                          {"get_weather", "get_time"})
        # A named function, streamed: the call's arguments arrive in pieces and join to valid JSON.
        stream = self.client.chat.completions.create(
            model=MODEL, messages=ask, tools=TOOLS, tool_choice={"type": "function", "function": {"name": "get_time"}},
            parallel_tool_calls=False, temperature=1.0, seed=13, max_tokens=500, stream=True)
        names, arguments, finish = [], "", None
        for chunk in stream:
            for call in chunk.choices[0].delta.tool_calls or []:
                if call.function.name:
                    names.append(call.function.name)
                arguments += call.function.arguments or ""
            finish = chunk.choices[0].finish_reason or finish
        self.assertEqual((names, finish), (["get_time"], "tool_calls"))
        check(json.loads(arguments), TIME)

    def test_refused_fields(self):
        ok = {"model": MODEL, "messages": chat("Hi"), "max_tokens": 4}
        cases = [
            ({**ok, "response_format": response_format({"type": "integer", "minimum": 0})}, "minimum"),
            ({**ok, "response_format": response_format({"type": "string", "format": "date"})}, "format"),
            ({**ok, "response_format": response_format({"anyOf": [{"type": "integer"}, {"type": "number"}]})},
             "anyOf"),
            ({**ok, "response_format": {"type": "json_schema", "json_schema": {"schema": {}}}}, "name"),
            ({**ok, "response_format": {"type": "yaml"}}, "response_format.type"),
            ({**ok, "tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}}, "nope"),
            ({**ok, "tools": [{"type": "function", "function": {"name": "f", "parameters": {
                "type": "object", "properties": {"x": {"type": "string", "pattern": "a"}}}}}],
              "tool_choice": "required"}, "tools[0].function.parameters #/properties/x: 'pattern'"),
            ({**ok, "response_format": {"type": "json_object"}, "ignore_eos": True}, "ignore_eos"),
            ({**ok, "tools": TOOLS, "parallel_tool_calls": False}, "parallel"),
            ({**ok, "messages": chat("Hi") + [{"role": "assistant", "content": "Sure", "prefix": True}],
              "response_format": {"type": "json_object"}}, "prefix"),
        ]
        for body, words in cases:
            with self.subTest(body=json.dumps(body)[:120]):
                r = self.server.http.post("/v1/chat/completions", json=body)
                self.assertEqual(r.status_code, 400, r.text)
                self.assertIn(words, r.json()["error"]["message"])
        r = self.server.http.post("/v1/completions", json={"model": MODEL, "prompt": "x",
                                                          "response_format": {"type": "json_object"}})
        self.assertEqual(r.status_code, 400)
        with self.assertRaises(openai.BadRequestError):
            self.client.chat.completions.create(model=MODEL, messages=chat("Hi"), max_tokens=2,
                                                response_format=response_format({"type": "string", "pattern": "x"}))
        # An assistant prefix that starts a valid answer is continued within the grammar.
        r = self.client.chat.completions.create(
            model=MODEL, max_tokens=400, temperature=1.0, seed=5, response_format=response_format(PERSON),
            messages=chat("Who?") + [{"role": "assistant", "content": '{"name": "Emma", ', "prefix": True}])
        self.assertEqual(r.choices[0].finish_reason, "stop")
        check(json.loads('{"name": "Emma", ' + r.choices[0].message.content), PERSON)

    def test_anthropic_forced_tools_and_output_format(self):
        # Anthropic's API has no seed: these draws differ between runs, hence the room in max_tokens.
        client = client_for(self.server)
        tools = [{"name": t["function"]["name"], "description": t["function"]["description"],
                  "input_schema": t["function"]["parameters"], "strict": True} for t in TOOLS]
        for choice in ({"type": "any", "disable_parallel_tool_use": True},
                       {"type": "tool", "name": "get_weather", "disable_parallel_tool_use": True}):
            with self.subTest(tool_choice=choice):
                m = client.messages.create(model=MODEL, max_tokens=800, messages=user("Weather in Bath?"),
                                           tools=tools, tool_choice=choice, extra_body={"temperature": 1.0})
                self.assertEqual(m.stop_reason, "tool_use")
                uses = [b for b in m.content if b.type == "tool_use"]
                self.assertEqual(len(uses), 1)
                if choice["type"] == "tool":
                    self.assertEqual(uses[0].name, "get_weather")
                check(uses[0].input, PARAMETERS[uses[0].name])
        m = client.messages.create(model=MODEL, max_tokens=800, messages=user("Describe someone."),
                                   extra_body={"temperature": 1.0,
                                               "output_config": {"format": {"type": "json_schema", "schema": PERSON}}})
        self.assertEqual(m.stop_reason, "end_turn")
        check(json.loads(m.content[0].text), PERSON)
        # Strict tools without a grammar over them, an unknown forced tool: refused.
        for body in ({"tools": tools}, {"tools": tools, "tool_choice": {"type": "tool", "name": "nope"}}):
            r = self.server.http.post("/v1/messages", json={"model": MODEL, "max_tokens": 4, "messages": user("Hi"),
                                                            **body})
            self.assertEqual(r.status_code, 400, r.text)
        client.close()


if __name__ == "__main__":
    unittest.main()
