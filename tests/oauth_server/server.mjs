// The authorization server tests/engram/test_oauth.py starts: node-oidc-provider (a
// maintained, certified OpenID/OAuth 2 server), issuing RS256 JWT access tokens by the
// client_credentials grant with RFC 8707 resource indicators. Its settings come as one
// JSON file (argv[2]): the port, the issuer, the private signing keys (a rotation is a
// restart with new ones), the clients and the scopes. It prints "ready" once listening
// and dies with its parent (the test closes its stdin).
import { readFileSync } from 'node:fs';
import Provider from 'oidc-provider';

const settings = JSON.parse(readFileSync(process.argv[2], 'utf8'));

const provider = new Provider(settings.issuer, {
  clients: settings.clients.map((c) => ({
    client_id: c.client_id,
    client_secret: c.client_secret,
    grant_types: ['client_credentials'],
    redirect_uris: [],
    response_types: [],
    scope: c.scope,
  })),
  jwks: { keys: settings.keys },
  scopes: settings.scopes,
  features: {
    devInteractions: { enabled: false },
    clientCredentials: { enabled: true },
    resourceIndicators: {
      enabled: true,
      defaultResource: () => undefined,
      useGrantedResource: () => true,
      getResourceServerInfo: (ctx, resourceIndicator) => ({
        scope: settings.scopes.join(' '),
        audience: resourceIndicator,
        accessTokenTTL: 300,
        accessTokenFormat: 'jwt',
        jwt: { sign: { alg: settings.alg || 'RS256' } },
      }),
    },
  },
});
provider.proxy = false;

// How often the keys were fetched, for the tests that check engram does not hammer them.
let jwksFetches = 0;
provider.use(async (ctx, next) => {
  if (ctx.path === '/test/jwks-fetches') {
    ctx.body = { fetches: jwksFetches };
    return;
  }
  if (ctx.path === '/jwks') jwksFetches += 1;
  await next();
});

const server = provider.listen(settings.port, '127.0.0.1', () => {
  process.stdout.write('ready\n');
});
// Stdin closed (the test ended, or died however it died): stop.
process.stdin.on('end', () => server.close(() => process.exit(0)));
process.stdin.on('error', () => process.exit(0));
process.stdin.resume();
