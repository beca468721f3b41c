//! `approve` and `approvals`: a session's questions answered, and its
//! approval policy shown or set, over protocol v8 (v1 has no approvals).

use super::activate::Target;
use super::discover::session_server;
use kernel::approval::{ApprovalPolicy, Decision};
use kernel::client::front;
use kernel::client::v8::approvals::Shown;
use kernel::client::v8::calls;
use pi_client::v8::V8Client;

/// The session `query` names, attached over v8 on its server.
async fn attached(target: &Target, query: &str) -> Result<(V8Client, String), String> {
    let (client, id) = session_server(target, query).await?;
    let server_id = super::commands::speaks_v8(target, &client);
    client.close().await;
    let Some(server_id) = server_id else {
        return Err(crate::text::APPROVALS_NEED_V8.to_owned());
    };
    let client = super::commands::connect_v8(target, &server_id).await?;
    client
        .attach(&id)
        .await
        .map_err(|e| format!("cannot attach to session {id}: {e}"))?;
    Ok((client, id))
}

/// The session's approvals as its replica shows them now.
fn shown(client: &V8Client) -> Option<Shown> {
    client.read(Shown::of)
}

/// `approve SESSION [--always | --deny] [--wait]`: answers the question the
/// session asks (the oldest), and says what was answered.
pub(super) async fn run_approve(
    target: &Target,
    query: &str,
    decision: Decision,
    wait: bool,
) -> Result<(), String> {
    let (client, id) = attached(target, query).await?;
    let result = approve(&client, &id, decision, wait).await;
    let _ = client.detach().await;
    outln!("{}", result?);
    Ok(())
}

async fn approve(
    client: &V8Client,
    id: &str,
    decision: Decision,
    wait: bool,
) -> Result<String, String> {
    let mut changes = client.changes();
    let question = loop {
        if let Some(q) = shown(client).and_then(|s| s.asked().cloned()) {
            break q;
        }
        if !wait {
            return Err(format!(
                "session {id} asks nothing: no tool call waits for an answer (--wait waits for one)"
            ));
        }
        if changes.recv().await.is_err() {
            return Err("the connection ended".to_owned());
        }
    };
    for line in crate::text::question_lines(&question) {
        eprintln!("{line}");
    }
    let request = front::Request::Answer {
        id: question.id.clone(),
        decision,
    };
    client
        .request(calls::request_of(id, &request))
        .await
        .map_err(|e| format!("cannot answer session {id}'s question: {e}"))?;
    let what = match decision {
        Decision::Allow => "allowed",
        Decision::Always => "allowed from now on",
        Decision::Deny => "denied",
    };
    Ok(format!(
        "{} {what} in session {id}",
        crate::text::sanitize(&question.tool)
    ))
}

/// `approvals SESSION [POLICY]`: shows the policy and the question waiting,
/// or sets the policy.
pub(super) async fn run_approvals(
    target: &Target,
    query: &str,
    policy: Option<ApprovalPolicy>,
) -> Result<(), String> {
    let (client, id) = attached(target, query).await?;
    let result = match policy {
        Some(policy) => {
            let request = front::Request::SetApprovals(policy);
            client
                .request(calls::request_of(&id, &request))
                .await
                .map(|_| format!("session {id} now approves as {}", policy.as_str()))
                .map_err(|e| format!("cannot set session {id}'s approval policy: {e}"))
        }
        None => shown(&client)
            .map(|s| crate::text::approvals_text(&id, &s))
            .ok_or_else(|| format!("session {id} shows no approvals")),
    };
    let _ = client.detach().await;
    outln!("{}", result?);
    Ok(())
}
