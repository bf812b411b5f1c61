//! The orders example's `GET /openapi.json` (feature `utoipa`): a valid OpenAPI 3.1
//! document whose `POST /orders` declares the idempotency contract.

#![cfg(feature = "utoipa")]

mod common;

use common::*;
use oas3::spec::{ObjectOrReference, ObjectSchema, ParameterIn, Response};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_example_declares_the_idempotency_contract() {
    if !common::Database::Postgres.configured() {
        return;
    }
    declares_the_idempotency_contract("orders").await;
}

#[cfg(feature = "sqlx")]
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn orders_sqlx_example_declares_the_idempotency_contract() {
    if !common::Database::Postgres.configured() {
        return;
    }
    declares_the_idempotency_contract("orders_sqlx").await;
}

/// The `code` enum of a response's problem document.
fn problem_codes(spec: &oas3::Spec, response: &Response) -> Vec<String> {
    let content = response
        .content
        .get("application/problem+json")
        .expect("a problem document");
    let schema = content.schema(spec).unwrap().expect("a schema");
    let code = schema.properties["code"].resolve(spec).unwrap();
    code.enum_values
        .iter()
        .map(|value| value.as_str().unwrap().to_owned())
        .collect()
}

fn header_schema(spec: &oas3::Spec, response: &Response, name: &str) -> ObjectSchema {
    let header = match &response.headers[name] {
        ObjectOrReference::Object(header) => header.clone(),
        reference => reference.resolve(spec).unwrap(),
    };
    header.schema.expect("a schema").resolve(spec).unwrap()
}

async fn declares_the_idempotency_contract(example: &str) {
    let db = TestDb::bare(1).await;
    let (_child, addr) = start_example(example, &[("DATABASE_URL", &schema_url(&db.schema))]).await;
    let response = reqwest::get(format!("http://{addr}/openapi.json"))
        .await
        .unwrap();
    assert_eq!(response.status(), 200);
    assert_eq!(response.headers()["content-type"], "application/json");
    let text = response.text().await.unwrap();

    let spec = oas3::from_json(&text).expect("a valid OpenAPI 3.1 document");
    assert_eq!(spec.validate_version().unwrap().major, 3);
    let post = spec
        .operation(&http::Method::POST, "/orders")
        .expect("POST /orders is declared");

    let key = post
        .parameter("Idempotency-Key", &spec)
        .unwrap()
        .expect("the Idempotency-Key parameter");
    assert_eq!(key.location, ParameterIn::Header);
    assert_eq!(key.required, Some(true));
    let schema = key.schema.unwrap().resolve(&spec).unwrap();
    // 255 characters, quoted with every one escaped.
    assert_eq!((schema.min_length, schema.max_length), (Some(1), Some(512)));
    let pattern = regex::Regex::new(&schema.pattern.expect("the key's syntax")).unwrap();
    for key in [
        "8e03978e-40d5-43e8-bc93-6894a57f9324",
        "order-42",
        r#""order 42""#,
        r#""say \"hi\" \\ bye""#,
        &"k".repeat(255),
        &format!("\"{}\"", "k".repeat(255)),
    ] {
        assert!(
            axum_idempotency::IdempotencyKey::parse(key.as_bytes()).is_ok(),
            "{key}"
        );
        assert!(pattern.is_match(key), "the schema refuses {key}");
    }
    for key in [
        "order 42",
        r#""unterminated"#,
        r#""bad \x escape""#,
        "caf\u{e9}",
        // One character over the layer's limit, bare and quoted.
        &"k".repeat(256),
        &format!("\"{}\"", "k".repeat(256)),
    ] {
        assert!(
            axum_idempotency::IdempotencyKey::parse(key.as_bytes()).is_err(),
            "{key}"
        );
        assert!(!pattern.is_match(key), "the schema allows {key}");
    }

    let responses = post.responses(&spec);
    let codes = |status: &str| problem_codes(&spec, &responses[status]);
    assert_eq!(
        codes("400"),
        [
            "malformed_json",
            "invalid_x_user_id",
            "missing_key",
            "invalid_key",
            "body_unreadable"
        ],
        "the handler's own 400 keeps its code and gains the layer's"
    );
    assert_eq!(codes("415"), ["unsupported_media_type"]);
    assert_eq!(codes("408"), ["body_timeout"]);
    assert_eq!(codes("409"), ["in_flight", "lease_lost"]);
    assert_eq!(codes("413"), ["payload_too_large"]);
    assert_eq!(
        codes("422"),
        ["invalid_amount", "invalid_body", "key_reused"],
        "the handler's own 422 keeps its code and gains the layer's"
    );
    assert_eq!(
        codes("503"),
        [
            "database_unavailable",
            "store_unavailable",
            "commit_failed",
            "handler_timed_out"
        ]
    );
    for status in ["409", "503"] {
        let retry_after = header_schema(&spec, &responses[status], "Retry-After");
        assert!(retry_after.schema_type.is_some(), "{status}");
    }

    let replayed = header_schema(&spec, &responses["201"], "Idempotent-Replayed");
    assert_eq!(replayed.enum_values, [serde_json::json!("true")]);

    // Paying is keyed like creating.
    let pay = spec
        .operation(&http::Method::POST, "/orders/{order_no}/pay")
        .expect("POST /orders/{order_no}/pay is declared");
    let key = pay.parameter("Idempotency-Key", &spec).unwrap();
    assert_eq!(key.and_then(|key| key.required), Some(true));
    let responses = pay.responses(&spec);
    assert_eq!(
        problem_codes(&spec, &responses["409"]),
        ["in_flight", "lease_lost"]
    );
    let replayed = header_schema(&spec, &responses["200"], "Idempotent-Replayed");
    assert_eq!(replayed.enum_values, [serde_json::json!("true")]);

    // The caller's header is what the layer's scope reads: a required integer.
    let user = post
        .parameter("X-User-Id", &spec)
        .unwrap()
        .expect("the X-User-Id parameter");
    assert_eq!(user.required, Some(true));
    let user_schema = user.schema.unwrap().resolve(&spec).unwrap();
    assert_eq!(
        user_schema.schema_type,
        Some(oas3::spec::SchemaTypeSet::Single(
            oas3::spec::SchemaType::Integer
        ))
    );

    // The body's rejections are the problem documents the document declares.
    let client = reqwest::Client::new();
    for (content_type, body, status, code) in [
        (
            "application/json",
            r#"{"user_id": 1, "amount""#,
            400,
            "malformed_json",
        ),
        (
            "application/json",
            r#"{"user_id": "one", "amount": 5}"#,
            422,
            "invalid_body",
        ),
        ("application/json", r#"{"amount": 5}"#, 422, "invalid_body"),
        (
            "text/plain",
            r#"{"user_id": 1, "amount": 5}"#,
            415,
            "unsupported_media_type",
        ),
    ] {
        let response = client
            .post(format!("http://{addr}/orders"))
            .header("idempotency-key", format!("body-{code}-{}", body.len()))
            .header("x-user-id", "1")
            .header("content-type", content_type)
            .body(body)
            .send()
            .await
            .unwrap();
        assert_eq!(response.status().as_u16(), status, "{body}");
        assert_eq!(
            response.headers()["content-type"],
            "application/problem+json",
            "{body}"
        );
        let problem: serde_json::Value =
            serde_json::from_str(&response.text().await.unwrap()).unwrap();
        assert_eq!(problem["code"], code, "{body}");
        assert_eq!(problem["status"], status, "{body}");
        assert!(
            codes(&status.to_string()).iter().any(|c| c == code),
            "{code} is declared for {status}"
        );
    }

    // A caller without an integer X-User-Id is refused as the document declares.
    for user in [None, Some("one")] {
        let mut request = client
            .post(format!("http://{addr}/orders"))
            .header("idempotency-key", "no-user")
            .header("content-type", "application/json")
            .body(r#"{"user_id": 1, "amount": 5}"#);
        if let Some(user) = user {
            request = request.header("x-user-id", user);
        }
        let response = request.send().await.unwrap();
        assert_eq!(response.status().as_u16(), 400, "{user:?}");
        let problem: serde_json::Value =
            serde_json::from_str(&response.text().await.unwrap()).unwrap();
        assert_eq!(problem["code"], "invalid_x_user_id", "{user:?}");
    }

    // The read is not keyed.
    let get = spec
        .operation(&http::Method::GET, "/orders/{order_no}")
        .expect("GET /orders/{order_no} is declared");
    assert!(
        get.parameter("Idempotency-Key", &spec).unwrap().is_none(),
        "GET is not keyed"
    );
}

/// The `Idempotency-Key` header's schema as `IdempotencyDoc` declares it: what a client
/// generating from the document believes the layer accepts.
struct KeySchema {
    pattern: regex::Regex,
    min_length: usize,
    max_length: usize,
}

impl KeySchema {
    fn declared() -> Self {
        use axum::http::Method;
        use axum_idempotency::openapi::IdempotencyDoc;
        use utoipa::openapi::path::{HttpMethod, OperationBuilder, PathItem};
        use utoipa::openapi::{OpenApiBuilder, PathsBuilder};

        let mut openapi = OpenApiBuilder::new()
            .paths(PathsBuilder::new().path(
                "/orders",
                PathItem::new(HttpMethod::Post, OperationBuilder::new().build()),
            ))
            .build();
        IdempotencyDoc::new()
            .operation(Method::POST, "/orders")
            .apply(&mut openapi)
            .unwrap();
        let json = serde_json::to_value(&openapi).unwrap();
        let parameters = json["paths"]["/orders"]["post"]["parameters"]
            .as_array()
            .expect("parameters");
        let key = parameters
            .iter()
            .find(|parameter| parameter["name"] == "Idempotency-Key")
            .expect("the Idempotency-Key parameter");
        assert_eq!(key["in"], "header");
        let schema = &key["schema"];
        let length = |name: &str| {
            let length = schema[name]
                .as_u64()
                .unwrap_or_else(|| panic!("{name}: {schema}"));
            usize::try_from(length).unwrap()
        };
        Self {
            pattern: regex::Regex::new(schema["pattern"].as_str().expect("the key's syntax"))
                .unwrap(),
            min_length: length("minLength"),
            max_length: length("maxLength"),
        }
    }

    fn admits(&self, value: &str) -> bool {
        (self.min_length..=self.max_length).contains(&value.chars().count())
            && self.pattern.is_match(value)
    }
}

/// Whether the layer accepts `value` as an `Idempotency-Key`.
fn accepted(value: &str) -> bool {
    axum_idempotency::IdempotencyKey::parse(value.as_bytes()).is_ok()
}

#[test]
fn the_key_schema_is_the_parser_s_language_at_its_limits() {
    use axum_idempotency::MAX_KEY_LEN;
    let schema = KeySchema::declared();
    let bare = |n| "k".repeat(n);
    let quoted = |n| format!("\"{}\"", "k".repeat(n));
    let escaped = |n| format!("\"{}\"", "\\\"".repeat(n));
    for value in [
        bare(1),
        bare(MAX_KEY_LEN),
        bare(MAX_KEY_LEN + 1),
        quoted(MAX_KEY_LEN),
        quoted(MAX_KEY_LEN + 1),
        escaped(MAX_KEY_LEN),
        escaped(MAX_KEY_LEN + 1),
        quoted(0),
        String::new(),
        "order 42".to_owned(),
        "\"order 42\"".to_owned(),
    ] {
        assert_eq!(
            schema.admits(&value),
            accepted(&value),
            "{} characters: {value:?}",
            value.len()
        );
    }
    assert!(schema.admits(&escaped(MAX_KEY_LEN)));
    // The longest value the layer accepts is the longest the schema admits.
    assert_eq!(escaped(MAX_KEY_LEN).len(), schema.max_length);
}

/// A seeded stream of pseudo-random values (splitmix64), so every run checks the same
/// values and a failing one fails again.
struct Gen(u64);

impl Gen {
    fn u64(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A value in `0..n`.
    fn below(&mut self, n: usize) -> usize {
        ((u128::from(self.u64()) * n as u128) >> 64) as usize
    }

    /// A value in `range`.
    fn usize_in(&mut self, range: std::ops::RangeInclusive<usize>) -> usize {
        range.start() + self.below(range.end() - range.start() + 1)
    }

    /// A `char` from one of `ranges` (inclusive): a range chosen uniformly, then a `char`
    /// uniformly within it.
    fn char_in(&mut self, ranges: &[(char, char)]) -> char {
        let (start, end) = ranges[self.below(ranges.len())];
        let offset = self.below((end as usize) - (start as usize) + 1);
        char::from_u32(start as u32 + offset as u32).unwrap()
    }

    /// `len` `char`s from `ranges`, the count drawn from `len`.
    fn string(&mut self, len: std::ops::RangeInclusive<usize>, ranges: &[(char, char)]) -> String {
        let len = self.usize_in(len);
        (0..len).map(|_| self.char_in(ranges)).collect()
    }

    /// One of four families of header values: short printable ASCII, bare or quoted (with
    /// its `"` and `\` unescaped, so often malformed); long bare tokens around the length
    /// limit; and long well-formed quoted strings with escapes around it.
    fn key_header(&mut self) -> String {
        const PRINTABLE: &[(char, char)] = &[(' ', '~')];
        match self.below(4) {
            0 => self.string(0..=40, PRINTABLE),
            1 => format!("\"{}\"", self.string(0..=40, PRINTABLE)),
            2 => self.string(250..=260, &[('!', '!'), ('#', '~')]),
            _ => {
                let mut value = String::from("\"");
                for _ in 0..self.usize_in(250..=260) {
                    if self.below(2) == 0 {
                        value.push(self.char_in(&[(' ', '!'), ('#', '['), (']', '~')]));
                    } else {
                        value.push('\\');
                        value.push(self.char_in(&[('"', '"'), ('\\', '\\')]));
                    }
                }
                value.push('"');
                value
            }
        }
    }
}

#[test]
fn the_key_schema_admits_exactly_what_the_parser_accepts() {
    let schema = KeySchema::declared();
    let mut g = Gen(0x6b65_795f_7363_6865);
    for _ in 0..256 {
        let value = g.key_header();
        assert_eq!(schema.admits(&value), accepted(&value), "{value:?}");
    }
}

/// `IdempotencyDoc::for_layer` declares what the layer does: the key required or optional,
/// and the 429 answer only on a layer with a per-key attempt limit.
#[tokio::test]
async fn the_declaration_follows_the_layer() {
    if !common::Database::Postgres.configured() {
        return;
    }
    use axum::http::Method;
    use axum_idempotency::IdempotencyLayer;
    use axum_idempotency::openapi::IdempotencyDoc;
    use utoipa::openapi::path::{HttpMethod, OperationBuilder, PathItem};
    use utoipa::openapi::{OpenApiBuilder, PathsBuilder};

    // A pool connects on first use; declaring needs no database.
    let pool = pool_for("public", 1);
    let declared = |layer: &IdempotencyLayer<_>| {
        let mut openapi = OpenApiBuilder::new()
            .paths(PathsBuilder::new().path(
                "/orders",
                PathItem::new(HttpMethod::Post, OperationBuilder::new().build()),
            ))
            .build();
        IdempotencyDoc::for_layer(layer)
            .operation(Method::POST, "/orders")
            .apply(&mut openapi)
            .unwrap();
        let json: serde_json::Value = serde_json::from_str(&openapi.to_json().unwrap()).unwrap();
        let post = json["paths"]["/orders"]["post"].clone();
        (
            post["parameters"][0]["required"].clone(),
            post["responses"].get("429").is_some(),
        )
    };
    let default = IdempotencyLayer::new(pool.clone());
    assert_eq!(declared(&default), (serde_json::json!(true), false));
    let optional = IdempotencyLayer::new(pool)
        .key_required(false)
        .key_attempt_limit(5);
    assert_eq!(declared(&optional), (serde_json::json!(false), true));
}
