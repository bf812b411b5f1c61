//! `GET /openapi.json` for the orders examples (feature `utoipa`): the service's OpenAPI
//! document, with `axum_idempotency::openapi::IdempotencyDoc` declaring the
//! `Idempotency-Key` header, the layer's problem responses and `Idempotent-Replayed` on the
//! keyed operations. Without the feature there is no such route (404).

use axum::Router;
use axum_idempotency::{IdempotencyLayer, LeaseStore};

/// The routes to merge into the application: `GET /openapi.json`, declaring the key as
/// `layer` is configured, or none.
pub(crate) fn router<D: LeaseStore>(layer: &IdempotencyLayer<D>) -> Router {
    #[cfg(feature = "utoipa")]
    {
        let json = document(layer)
            .to_json()
            .expect("an OpenAPI document serializes to JSON");
        Router::new().route(
            "/openapi.json",
            axum::routing::get(move || {
                let json = json.clone();
                async move { ([("content-type", "application/json")], json) }
            }),
        )
    }
    #[cfg(not(feature = "utoipa"))]
    {
        let _ = layer;
        Router::new()
    }
}

/// The document: the operations as the handlers implement them, then the idempotency
/// contract on the keyed ones.
#[cfg(feature = "utoipa")]
fn document<D: LeaseStore>(layer: &IdempotencyLayer<D>) -> utoipa::openapi::OpenApi {
    use axum::http::Method;
    use axum_idempotency::openapi::IdempotencyDoc;
    use utoipa::openapi::path::{HttpMethod, OperationBuilder, ParameterBuilder, ParameterIn};
    use utoipa::openapi::request_body::RequestBodyBuilder;
    use utoipa::openapi::{
        ComponentsBuilder, Content, HeaderBuilder, InfoBuilder, KnownFormat, ObjectBuilder,
        OpenApiBuilder, PathItem, PathsBuilder, Ref, Required, ResponseBuilder, SchemaFormat, Type,
    };

    // The handlers read integers as `i64`.
    let integer = || {
        ObjectBuilder::new()
            .schema_type(Type::Integer)
            .format(Some(SchemaFormat::KnownFormat(KnownFormat::Int64)))
    };
    let string = || ObjectBuilder::new().schema_type(Type::String);
    let new_order = ObjectBuilder::new()
        .schema_type(Type::Object)
        .property("user_id", integer())
        .property(
            "amount",
            integer()
                .minimum(Some(1))
                .description(Some("Positive, in cents.")),
        )
        .required("user_id")
        .required("amount");
    let order = ObjectBuilder::new()
        .schema_type(Type::Object)
        .property("order_no", string())
        .property("user_id", integer())
        .property("amount", integer())
        .required("order_no")
        .required("user_id")
        .required("amount");
    // What the layer's `scope` reads, required on the keyed routes (`support/user.rs`).
    let user = || {
        ParameterBuilder::new()
            .name("X-User-Id")
            .parameter_in(ParameterIn::Header)
            .required(Required::True)
            .description(Some(
                "The caller's integer user id: keys are scoped per caller. Missing or not an \
                 integer: 400 `invalid_x_user_id`, and nothing is created or stored.",
            ))
            .schema(Some(integer()))
    };
    let order_json = || Content::new(Some(Ref::from_schema_name("Order")));
    // The handlers' own problem documents: `code` is all a client branches on.
    let problem = |description: &str, codes: &[&str]| {
        ResponseBuilder::new().description(description).content(
            "application/problem+json",
            Content::new(Some(
                ObjectBuilder::new()
                    .schema_type(Type::Object)
                    .property("code", string().enum_values(Some(codes.to_vec())))
                    .required("code"),
            )),
        )
    };
    let unavailable = || {
        problem(
            "The database is unavailable; retry later.",
            &["database_unavailable"],
        )
    };
    let failed = || {
        problem(
            "A statement failed in the database; its work was rolled back.",
            &["database_error"],
        )
    };
    let order_no = || {
        ParameterBuilder::new()
            .name("order_no")
            .parameter_in(ParameterIn::Path)
            .required(Required::True)
            .schema(Some(string()))
    };

    let mut create_order = OperationBuilder::new()
        .operation_id(Some("create_order"))
        .summary(Some("Creates an order, once per Idempotency-Key."))
        .parameter(user())
        .request_body(Some(
            RequestBodyBuilder::new()
                .required(Some(Required::True))
                .content(
                    "application/json",
                    Content::new(Some(Ref::from_schema_name("NewOrder"))),
                )
                .build(),
        ))
        .response(
            "201",
            ResponseBuilder::new()
                .description("The order was created.")
                .header(
                    "Location",
                    HeaderBuilder::new()
                        .schema(string())
                        .description(Some("The order's URL."))
                        .build(),
                )
                .content("application/json", order_json()),
        )
        .response("500", failed())
        .response("503", unavailable());
    // The body's rejections (`JsonBody`), and the amount's.
    for (status, code, description) in crate::json::REJECTIONS {
        let (description, codes) = if status == axum::http::StatusCode::UNPROCESSABLE_ENTITY {
            (
                format!("{description} Or the amount is not positive."),
                vec!["invalid_amount", code],
            )
        } else if status == axum::http::StatusCode::BAD_REQUEST {
            (
                format!("{description} Or X-User-Id is missing or not an integer."),
                vec![code, crate::user::INVALID],
            )
        } else {
            (description.to_owned(), vec![code])
        };
        create_order = create_order.response(status.as_str(), problem(&description, &codes));
    }
    let pay_order = OperationBuilder::new()
        .operation_id(Some("pay_order"))
        .summary(Some(
            "Pays an order (NEW to PAID), once per Idempotency-Key.",
        ))
        .parameter(order_no())
        .parameter(user())
        .response(
            "200",
            ResponseBuilder::new()
                .description("The order is paid.")
                .content(
                    "application/json",
                    Content::new(Some(
                        ObjectBuilder::new()
                            .schema_type(Type::Object)
                            .property("order_no", string())
                            .property("status", string().enum_values(Some(["PAID"])))
                            .required("order_no")
                            .required("status"),
                    )),
                ),
        )
        .response(
            "400",
            problem(
                "X-User-Id is missing or not an integer.",
                &[crate::user::INVALID],
            ),
        )
        .response(
            "404",
            problem("No order with this number.", &["unknown_order"]),
        )
        .response("500", failed())
        .response("503", unavailable());
    let get_order = OperationBuilder::new()
        .operation_id(Some("get_order"))
        .summary(Some("Reads an order."))
        .parameter(order_no())
        .response(
            "200",
            ResponseBuilder::new()
                .description("The order.")
                .content("application/json", order_json()),
        )
        .response("404", ResponseBuilder::new().description("No such order."));

    let mut openapi = OpenApiBuilder::new()
        .info(
            InfoBuilder::new()
                .title("orders example")
                .version(env!("CARGO_PKG_VERSION")),
        )
        .paths(
            PathsBuilder::new()
                .path("/orders", PathItem::new(HttpMethod::Post, create_order))
                .path(
                    "/orders/{order_no}",
                    PathItem::new(HttpMethod::Get, get_order),
                )
                .path(
                    "/orders/{order_no}/pay",
                    PathItem::new(HttpMethod::Post, pay_order),
                ),
        )
        .components(Some(
            ComponentsBuilder::new()
                .schema("NewOrder", new_order)
                .schema("Order", order)
                .build(),
        ))
        .build();
    IdempotencyDoc::for_layer(layer)
        .operation(Method::POST, "/orders")
        .operation(Method::POST, "/orders/{order_no}/pay")
        .apply(&mut openapi)
        .expect("every keyed operation is in the document");
    openapi
}
