//! The output items of a response, built as the chat output parser yields
//! reasoning, content and tool calls: a `reasoning` item, a `message` with
//! one `output_text` part, and a `function_call` item per call, in the
//! order the model wrote them. Each step also records the typed stream
//! events it makes (without `sequence_number`: the stream numbers them), so
//! the whole body and the stream come from one path.

use serde_json::{json, Value as Json};

use crate::openai::response::random_id;
use crate::text::outparse::ParsedDelta;

#[derive(Default)]
enum Open {
    #[default]
    None,
    Reasoning,
    Message,
}

#[derive(Default)]
pub struct Output {
    /// Finished items, then the open one (last) while `open` says so.
    pub items: Vec<Json>,
    open: Open,
    /// Whitespace held back before a message opens: leading whitespace is
    /// no content (nor, with tool calls, whitespace between them).
    held: String,
    /// All reasoning text (to count reasoning tokens).
    pub reasoning: String,
    /// Events made since the stream last took them.
    pub events: Vec<Json>,
}

impl Output {
    pub fn saw_tool_call(&self) -> bool {
        self.items.iter().any(|i| i["type"] == "function_call")
    }

    /// Adds what the parser read from one progress.
    pub fn add(&mut self, delta: ParsedDelta) {
        if !delta.reasoning.is_empty() {
            self.reasoning_delta(&delta.reasoning);
        }
        if !delta.content.is_empty() {
            self.content_delta(&delta.content);
        }
        for call in delta.tool_calls {
            self.close("completed");
            self.held.clear();
            let item = json!({
                "id": random_id("fc_"),
                "type": "function_call",
                "call_id": random_id("call_"),
                "name": call.name,
                "arguments": call.arguments,
                "status": "completed",
            });
            let index = self.items.len();
            let mut added = item.clone();
            added["arguments"] = "".into();
            added["status"] = "in_progress".into();
            self.event(
                "response.output_item.added",
                json!({"output_index": index, "item": added}),
            );
            let at = json!({"output_index": index, "item_id": item["id"]});
            self.event(
                "response.function_call_arguments.delta",
                with(&at, json!({"delta": call.arguments})),
            );
            self.event(
                "response.function_call_arguments.done",
                with(&at, json!({"arguments": call.arguments, "name": call.name})),
            );
            self.event(
                "response.output_item.done",
                json!({"output_index": index, "item": item}),
            );
            self.items.push(item);
        }
    }

    fn reasoning_delta(&mut self, text: &str) {
        self.reasoning.push_str(text);
        if !matches!(self.open, Open::Reasoning) {
            self.close("completed");
            let item = json!({
                "id": random_id("rs_"), "type": "reasoning", "summary": [],
                "content": [], "encrypted_content": null, "status": "in_progress",
            });
            self.open_item(item, json!({"type": "reasoning_text", "text": ""}));
            self.open = Open::Reasoning;
        }
        self.part_delta("response.reasoning_text.delta", text);
    }

    fn content_delta(&mut self, text: &str) {
        if !matches!(self.open, Open::Message) {
            if text.trim().is_empty() {
                self.held.push_str(text);
                return;
            }
            self.close("completed");
            let item = json!({
                "id": random_id("msg_"), "type": "message", "role": "assistant",
                "status": "in_progress", "content": [],
            });
            self.open_item(item, output_text(""));
            self.open = Open::Message;
            // The blank lines after `</think>` (and before the text) are the
            // template's layout, not the answer.
            self.held.clear();
            self.part_delta("response.output_text.delta", text.trim_start());
            return;
        }
        self.part_delta("response.output_text.delta", text);
    }

    fn open_item(&mut self, item: Json, part: Json) {
        let index = self.items.len();
        self.event(
            "response.output_item.added",
            json!({"output_index": index, "item": item}),
        );
        let mut item = item;
        item["content"] = json!([part.clone()]);
        let at = self.at(&item);
        self.items.push(item);
        self.event(
            "response.content_part.added",
            with(&at, json!({"part": part})),
        );
    }

    fn part_delta(&mut self, kind: &str, text: &str) {
        let item = self.items.last_mut().expect("an item is open");
        let part = &mut item["content"][0];
        let whole = format!("{}{text}", part["text"].as_str().unwrap_or(""));
        part["text"] = whole.into();
        let at = self.at(self.items.last().expect("an item is open"));
        let mut fields = json!({"delta": text});
        if kind == "response.output_text.delta" {
            fields["logprobs"] = json!([]);
        }
        self.event(kind, with(&at, fields));
    }

    /// Closes the open item with `status` (an item cut off by the token
    /// limit is `incomplete`); at the end, whitespace-only output with no
    /// tool call is still the message.
    pub fn close(&mut self, status: &str) {
        let open = std::mem::replace(&mut self.open, Open::None);
        let done_kind = match open {
            Open::None => return,
            Open::Reasoning => "response.reasoning_text.done",
            Open::Message => "response.output_text.done",
        };
        let index = self.items.len() - 1;
        let item = &mut self.items[index];
        item["status"] = status.into();
        let part = item["content"][0].clone();
        let at = self.at(&self.items[index]);
        let mut done = json!({"text": part["text"]});
        if matches!(open, Open::Message) {
            done["logprobs"] = json!([]);
        }
        self.event(done_kind, with(&at, done));
        self.event(
            "response.content_part.done",
            with(&at, json!({"part": part})),
        );
        let item = self.items[index].clone();
        self.event(
            "response.output_item.done",
            json!({"output_index": index, "item": item}),
        );
    }

    /// The end of the output: held whitespace becomes the message when
    /// nothing else was said, then the open item closes.
    pub fn finish(&mut self, status: &str) {
        if !self.held.is_empty() && !self.saw_tool_call() && matches!(self.open, Open::None) {
            let held = std::mem::take(&mut self.held);
            let item = json!({
                "id": random_id("msg_"), "type": "message", "role": "assistant",
                "status": "in_progress", "content": [],
            });
            self.open_item(item, output_text(""));
            self.open = Open::Message;
            self.part_delta("response.output_text.delta", &held);
        }
        self.close(status);
    }

    fn at(&self, item: &Json) -> Json {
        json!({"output_index": self.items.iter().position(|i| i["id"] == item["id"]).unwrap_or(self.items.len()), "item_id": item["id"], "content_index": 0})
    }

    fn event(&mut self, kind: &str, fields: Json) {
        self.events.push(with(&json!({"type": kind}), fields));
    }
}

fn output_text(text: &str) -> Json {
    json!({"type": "output_text", "text": text, "annotations": [], "logprobs": []})
}

/// `a` with `b`'s fields added.
fn with(a: &Json, b: Json) -> Json {
    let mut out = a.clone();
    if let (Some(out), Json::Object(b)) = (out.as_object_mut(), b) {
        out.extend(b);
    }
    out
}

/// The chat messages of a response's output (what a continuing response
/// sees of it): one assistant turn with its reasoning, text and calls.
pub fn as_messages(items: &[Json]) -> Vec<Json> {
    let mut turn = json!({"role": "assistant", "content": ""});
    let mut calls = Vec::new();
    for item in items {
        let text = item["content"][0]["text"].as_str().unwrap_or("");
        match item["type"].as_str() {
            Some("reasoning") => turn["reasoning_content"] = text.into(),
            Some("message") => turn["content"] = text.into(),
            Some("function_call") => calls.push(json!({
                "id": item["call_id"], "type": "function",
                "function": {"name": item["name"], "arguments": item["arguments"]},
            })),
            _ => {}
        }
    }
    if !calls.is_empty() {
        turn["tool_calls"] = calls.into();
    }
    vec![turn]
}
