//! The `Join` service: a new device's way to a certificate, on an issuer. Anyone may call it,
//! with or without a client certificate (the token is the credential; the certificate gate in
//! [`super::gate`] lets certificate-less callers reach this service only). It translates; the
//! [`Issuer`] decides.

use std::sync::Arc;

use mesh_cert::TlsError;
use mesh_proto::v1 as pb;
use tonic::{Request, Response, Status};

use crate::issuer::{Issuer, RedeemError};

/// Largest `Join` message accepted: a secret (256 bytes), a name and a CSR (4 KiB) fit.
const MAX_JOIN_MESSAGE_BYTES: usize = 16 * 1024;

/// The `agentmesh.v1.Join` service.
#[derive(Debug, Clone)]
pub(crate) struct JoinService {
    issuer: Arc<Issuer>,
}

impl JoinService {
    /// Serves `issuer`.
    pub(crate) fn new(issuer: Arc<Issuer>) -> Self {
        Self { issuer }
    }

    /// The tonic server for this service, with message size limits.
    pub(crate) fn into_server(self) -> pb::join_server::JoinServer<Self> {
        pb::join_server::JoinServer::new(self)
            .max_decoding_message_size(MAX_JOIN_MESSAGE_BYTES)
            .max_encoding_message_size(64 * 1024)
    }
}

impl From<RedeemError> for Status {
    fn from(error: RedeemError) -> Self {
        let message = error.to_string();
        match error {
            RedeemError::Malformed(_) | RedeemError::BadRequest(_) => {
                Status::invalid_argument(message)
            }
            RedeemError::Forged(_) | RedeemError::Expired { .. } | RedeemError::UsedUp { .. } => {
                Status::permission_denied(message)
            }
            RedeemError::NameInUse { .. } => Status::already_exists(message),
            RedeemError::Busy => Status::resource_exhausted(message),
            RedeemError::Store(e) => super::store_status(&e, message),
            RedeemError::Record(TlsError::RecordsFull { .. }) => {
                Status::resource_exhausted(message)
            }
            RedeemError::Record(_) => Status::internal(message),
        }
    }
}

#[tonic::async_trait]
impl pb::join_server::Join for JoinService {
    async fn get_ca(
        &self,
        _request: Request<pb::GetCaRequest>,
    ) -> Result<Response<pb::GetCaResponse>, Status> {
        Ok(Response::new(pb::GetCaResponse {
            ca_pem: self.issuer.ca_pem().to_owned(),
        }))
    }

    async fn redeem(
        &self,
        request: Request<pb::RedeemRequest>,
    ) -> Result<Response<pb::RedeemResponse>, Status> {
        let from = request.remote_addr().map(|addr| addr.ip());
        let request = request.into_inner();
        let issued = self
            .issuer
            .redeem(&request.secret, &request.name, &request.csr_pem, from)
            .await?;
        Ok(Response::new(pb::RedeemResponse {
            cert_pem: issued.cert_pem,
        }))
    }
}
