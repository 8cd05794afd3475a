//! A round: the broker answers its own input requests of a server's `input_required`
//! result, then the proxy sends the request again itself (when every input request was the
//! broker's) or shows the host the rest and keeps the broker's answers for the host's retry.
//!
//! A round runs on its own task, so the server's other messages go on meanwhile; what one
//! round may ask of the broker, and keep of its answers, is bounded
//! ([`MAX_BROKER_INPUTS`], [`MAX_ANSWER_BYTES`]), as are the rounds at once and per request.

use std::collections::BTreeMap;

use serde_json::value::RawValue;

use super::state::Kept;
use super::{Eras, Outputs};
use crate::error::{Error, ErrorKind};
use crate::jsonrpc;
use crate::limits::{MAX_ANSWER_BYTES, MAX_BROKER_INPUTS};
use crate::outgoing::Outgoing;
use crate::transport::lenient::RequestId;
use crate::transport::modern;
use crate::transport::relay::ToServer;

impl Eras {
    /// Answers the broker's input requests of `ir`; then retries the request itself when
    /// every input request was the broker's, or else shows the host the rest and keeps the
    /// broker's answers for the host's retry.
    pub(super) async fn answer_inputs(&self, ir: modern::InputRequired, kept: Kept, out: Outputs) {
        let Outputs {
            to_host,
            to_server,
            server_budget,
        } = out;
        let answers = self.answer_broker_inputs(&ir).await;
        let hosts = ir.host_keys();
        let host_id = kept.host_id.clone();
        let failed = |why: &str| {
            let err = Error::new(ErrorKind::Internal, format!("fsbroker: {why}"));
            Outgoing::from(jsonrpc::error_frame(Some(&host_id), &err))
        };
        if hosts.is_empty() {
            let id = self.fresh_id("retry");
            let Some(line) = modern::retry(&kept.request, &id, &answers, ir.state.as_deref())
            else {
                let _ = to_host
                    .send(failed("the request could not be sent again"))
                    .await;
                return;
            };
            let key = RequestId::of_text(&id);
            let retry = Kept {
                rounds: kept.rounds + 1,
                ..kept
            };
            if self.state().keep(key, retry).is_err() {
                let _ = to_host
                    .send(failed("too many requests are waiting to be sent again"))
                    .await;
                return;
            }
            let mut framed = line;
            framed.push(b'\n');
            if let Some(frame) = server_budget.frame(framed).await {
                let _ = to_server.send(ToServer::Frame(frame)).await;
            }
            return;
        }
        // The host answers its part and retries; the broker's answers wait to be merged in.
        if !answers.is_empty() {
            if let Some(key) = modern::retry_key_for(&kept.request, &ir) {
                self.state().stash(key, answers);
            }
        }
        let frame = match modern::only_requests(&ir, &hosts, &kept.host_id) {
            Some(mut line) => {
                line.push(b'\n');
                Outgoing::from(line)
            }
            None => failed("the server's input requests could not be passed on"),
        };
        let _ = to_host.send(frame).await;
    }

    /// The broker's answer to each of `ir`'s input requests that are its own, by key: at most
    /// [`MAX_BROKER_INPUTS`] are asked and at most [`MAX_ANSWER_BYTES`] of answers kept; the
    /// others are answered with a `QuotaExceeded` error.
    async fn answer_broker_inputs(
        &self,
        ir: &modern::InputRequired,
    ) -> BTreeMap<String, Box<RawValue>> {
        #[derive(serde::Deserialize)]
        struct Req<'a> {
            #[serde(borrow)]
            params: Option<&'a RawValue>,
        }
        let mut answers = BTreeMap::new();
        let mut bytes = 0usize;
        for (n, key) in ir.broker_keys().into_iter().enumerate() {
            let method = ir.method(&key).unwrap_or_default().to_owned();
            let id = self.fresh_id("ask");
            let refuse = |why: String| {
                let err = Error::new(ErrorKind::QuotaExceeded, why);
                let id = RawValue::from_string(serde_json::to_string(&id).unwrap_or_default());
                modern::input_response(&jsonrpc::error_frame(id.ok().as_deref(), &err))
            };
            let answer = if n >= MAX_BROKER_INPUTS {
                refuse(format!(
                    "fsbroker answers at most {MAX_BROKER_INPUTS} input requests at a time"
                ))
            } else if bytes > MAX_ANSWER_BYTES {
                refuse(format!(
                    "fsbroker's answers in one round are limited to {MAX_ANSWER_BYTES} bytes"
                ))
            } else {
                let params = ir
                    .requests
                    .get(&key)
                    .and_then(|r| serde_json::from_str::<Req>(r.get()).ok())
                    .and_then(|r| r.params);
                let answer = self
                    .asker
                    .ask(&id, &method, params)
                    .await
                    .and_then(|frame| modern::input_response(&frame));
                match answer {
                    Some(answer) if bytes + answer.get().len() > MAX_ANSWER_BYTES => {
                        bytes = MAX_ANSWER_BYTES + 1;
                        refuse(format!(
                            "fsbroker's answers in one round are limited to {MAX_ANSWER_BYTES} bytes"
                        ))
                    }
                    Some(answer) => Some(answer),
                    None => {
                        tracing::warn!(%method, "the broker did not answer an input request");
                        None
                    }
                }
            };
            if let Some(answer) = answer {
                bytes += answer.get().len().min(MAX_ANSWER_BYTES);
                answers.insert(key, answer);
            }
        }
        answers
    }
}
