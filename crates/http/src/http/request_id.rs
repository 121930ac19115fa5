//! Every request's [`RequestId`]: taken from `X-Request-Id` or made up,
//! handed to the handlers, echoed in the response.

use axum::extract::{Request, State};
use axum::http::HeaderValue;
use axum::middleware::Next;
use axum::response::Response;

use crate::api::request_id::{RequestId, REQUEST_ID_HEADER};
use crate::api::state::SharedState;

/// Gives every request its [`RequestId`] (an extension handlers read),
/// echoes it in the response header and logs error statuses under it.
pub async fn with_request_id(
    State(state): State<SharedState>,
    mut req: Request,
    next: Next,
) -> Response {
    let id = match RequestId::from_header(req.headers().get(REQUEST_ID_HEADER)) {
        Ok(id) => id,
        Err(e) => return state.reject(e),
    };
    let (method, path) = (req.method().clone(), req.uri().path().to_string());
    req.extensions_mut().insert(id.clone());
    let mut resp = next.run(req).await;
    let status = resp.status();
    if status.is_client_error() || status.is_server_error() {
        log::info!("request {id}: {method} {path} -> {status}");
    }
    let value = HeaderValue::from_str(&id.0).expect("checked or generated as visible ASCII");
    resp.headers_mut().insert(REQUEST_ID_HEADER, value);
    resp
}
