//! The `agentmesh.v1.Keys` service: translates the wire format for `api_keys::Keys`. Adding
//! and revoking a front-door key is an operator's action, which the admission policy decides
//! (`Admission::may_operate`: this node's own machine's client certificate, or one it lets run
//! `shell` tasks); anyone with a certificate may list keys (never their hashes) and read
//! usage. In insecure mode there are no identities, and every caller may.

use std::sync::Arc;

use mesh_domain::{KeyPolicy, Principal};
use mesh_proto::v1 as pb;
use tonic::{Request, Response, Status};

use crate::{
    admission::{Admission, Operation},
    api_keys::{KeyInfo, KeyUsage, Keys, KeysError, ModelCount},
};

/// The Keys service.
#[derive(Debug, Clone)]
pub(crate) struct KeysService {
    keys: Arc<Keys>,
    /// Decides who is an operator.
    admission: Arc<Admission>,
    /// Whether callers present certificates (false in insecure mode).
    tls: bool,
}

impl KeysService {
    /// Wraps the node's keys; `admission` decides who is an operator.
    pub(crate) fn new(keys: Arc<Keys>, admission: Arc<Admission>, tls: bool) -> Self {
        Self {
            keys,
            admission,
            tls,
        }
    }

    /// The tonic server, with message size limits.
    pub(crate) fn into_server(self) -> pb::keys_server::KeysServer<Self> {
        pb::keys_server::KeysServer::new(self)
            .max_decoding_message_size(super::MAX_MESSAGE_BYTES)
            .max_encoding_message_size(4 * super::MAX_MESSAGE_BYTES)
    }

    /// Refuses a caller who may not add or remove keys; returns who it is (`None` in insecure
    /// mode).
    fn operator<T>(&self, request: &Request<T>) -> Result<Option<Principal>, Status> {
        if !self.tls {
            return Ok(None);
        }
        let principal = super::caller_identity(request)?.principal();
        self.admission
            .may_operate(&principal, Operation::Settings)
            .map_err(|e| Status::permission_denied(e.to_string()))?;
        Ok(Some(principal))
    }
}

/// Every key error has one status code.
impl From<KeysError> for Status {
    fn from(error: KeysError) -> Self {
        let message = error.to_string();
        match error {
            KeysError::NotFound(_) => Status::not_found(message),
            KeysError::Exists(_) => Status::already_exists(message),
            KeysError::InConfig(_) => Status::failed_precondition(message),
            KeysError::Invalid(_) | KeysError::Statement(_) => Status::invalid_argument(message),
            KeysError::Full => Status::resource_exhausted(message),
            KeysError::KeyFile { .. } => Status::internal(message),
            KeysError::Memory(memory) => memory.into(),
        }
    }
}

fn info_pb(key: &KeyInfo) -> pb::KeyInfo {
    pb::KeyInfo {
        name: key.name.clone(),
        source: key.source.as_str().to_owned(),
        policy: Some(pb::KeyPolicy::from(&key.policy)),
        created_ms: key.created_ms,
        first: false,
    }
}

fn models_pb(models: &std::collections::BTreeMap<String, ModelCount>) -> Vec<pb::ModelUsage> {
    models
        .iter()
        .map(|(model, count)| pb::ModelUsage {
            model: model.clone(),
            requests: count.requests,
            prompt_tokens: count.prompt_tokens,
            completion_tokens: count.completion_tokens,
        })
        .collect()
}

fn usage_pb(usage: &KeyUsage) -> pb::KeyUsage {
    pb::KeyUsage {
        name: usage.name.clone(),
        policy: Some(pb::KeyPolicy::from(&usage.policy)),
        today: models_pb(&usage.today),
        month: models_pb(&usage.month),
        tokens_today: usage.tokens_today,
        tokens_month: usage.tokens_month,
        requests_this_minute: usage.requests_this_minute,
        tokens_this_minute: usage.tokens_this_minute,
        day_resets_at_ms: usage.day_resets_at_ms,
        month_resets_at_ms: usage.month_resets_at_ms,
        minute_resets_at_ms: usage.minute_resets_at_ms,
    }
}

#[tonic::async_trait]
impl pb::keys_server::Keys for KeysService {
    async fn add(
        &self,
        request: Request<pb::KeyAddRequest>,
    ) -> Result<Response<pb::KeyInfo>, Status> {
        let by = self.operator(&request)?;
        let r = request.into_inner();
        let policy = match r.policy {
            Some(policy) => KeyPolicy::try_from(policy)?,
            None => KeyPolicy::default(),
        };
        let (key, first) = self
            .keys
            .add(
                &r.name,
                &r.sha256,
                policy,
                by.as_ref(),
                r.grant.map(Into::into),
            )
            .await?;
        tracing::info!(key = %key.name, first, "front-door key added");
        Ok(Response::new(pb::KeyInfo {
            first,
            ..info_pb(&key)
        }))
    }

    async fn remove(
        &self,
        request: Request<pb::KeyRemoveRequest>,
    ) -> Result<Response<pb::KeyRemoveResponse>, Status> {
        self.operator(&request)?;
        let name = request.into_inner().name;
        self.keys.remove(&name).await?;
        tracing::info!(key = %name, "front-door key revoked");
        Ok(Response::new(pb::KeyRemoveResponse {}))
    }

    async fn list(
        &self,
        _request: Request<pb::KeyListRequest>,
    ) -> Result<Response<pb::KeyListResponse>, Status> {
        let keys = self.keys.list().map_err(Status::from)?;
        Ok(Response::new(pb::KeyListResponse {
            keys: keys.iter().map(info_pb).collect(),
        }))
    }

    async fn usage(
        &self,
        _request: Request<pb::KeyUsageRequest>,
    ) -> Result<Response<pb::KeyUsageResponse>, Status> {
        let usage = self.keys.usage().map_err(Status::from)?;
        Ok(Response::new(pb::KeyUsageResponse {
            keys: usage.iter().map(usage_pb).collect(),
        }))
    }
}
