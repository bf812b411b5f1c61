//! The response future of [`Idempotency`](super::Idempotency).

use std::fmt;
use std::future::Future;
use std::pin::Pin;
use std::task::{Context, Poll, ready};

use axum::body::Body;
use axum::response::Response;
use bytes::Bytes;
use pin_project_lite::pin_project;

use crate::http::rejection::{RejectionHandler, finalize};

pub(crate) type BoxedResponse<E> = Pin<Box<dyn Future<Output = Result<Response, E>> + Send>>;

pin_project! {
    /// Response future of [`Idempotency`](super::Idempotency).
    ///
    /// Requests the layer does not act on (no key, or a method it does not cover) poll the
    /// inner future in place, with no allocation.
    pub struct ResponseFuture<F, E> {
        #[pin]
        kind: Kind<F, E>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, E> {
        Passthrough {
            #[pin]
            future: F,
            on_rejection: Option<RejectionHandler>,
        },
        KeyedRequest {
            future: BoxedResponse<E>,
        },
    }
}

impl<F, E> ResponseFuture<F, E> {
    pub(crate) fn passthrough(future: F, on_rejection: Option<RejectionHandler>) -> Self {
        Self {
            kind: Kind::Passthrough {
                future,
                on_rejection,
            },
        }
    }

    pub(crate) fn idempotent(future: BoxedResponse<E>) -> Self {
        Self {
            kind: Kind::KeyedRequest { future },
        }
    }
}

impl<F, B, E> Future for ResponseFuture<F, E>
where
    F: Future<Output = Result<Response<B>, E>>,
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<axum::BoxError>,
{
    type Output = Result<Response, E>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().kind.project() {
            KindProj::Passthrough {
                future,
                on_rejection,
            } => {
                let response = ready!(future.poll(cx))?;
                Poll::Ready(Ok(finalize(response.map(Body::new), on_rejection.as_ref())))
            }
            KindProj::KeyedRequest { future } => future.as_mut().poll(cx),
        }
    }
}

impl<F, E> fmt::Debug for ResponseFuture<F, E> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match self.kind {
            Kind::Passthrough { .. } => "Passthrough",
            Kind::KeyedRequest { .. } => "KeyedRequest",
        };
        f.debug_struct("ResponseFuture")
            .field("kind", &kind)
            .finish()
    }
}
